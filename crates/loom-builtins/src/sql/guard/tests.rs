//! The guard against hostile queries: each refused with the rule that should refuse it, and
//! the ordinary queries it must let through.

use std::collections::BTreeMap;

use super::*;
use crate::refusal_rule;

/// `customers` allows `id, name, city` of `id, name, city, email, secret`; `orders` allows
/// every column; `audit` exists but is not declared.
fn guard(dialect: SqlDialect) -> SqlGuard {
    SqlGuard::new(
        dialect,
        &[
            SqlTable::with_columns("customers", ["id", "name", "city"]),
            SqlTable::all_columns("orders"),
        ],
    )
}

fn schema() -> BTreeMap<String, Vec<String>> {
    BTreeMap::from([(
        "customers".to_owned(),
        ["id", "name", "city", "email", "secret"]
            .map(str::to_owned)
            .to_vec(),
    )])
}

fn check(dialect: SqlDialect, sql: &str) -> Result<String, ToolError> {
    let guard = guard(dialect);
    let parsed = guard.parse(sql)?;
    parsed.check_columns(&schema()).map(|guarded| guarded.sql)
}

fn rule_of(dialect: SqlDialect, sql: &str) -> Option<&'static str> {
    match check(dialect, sql) {
        Ok(rendered) => panic!("{dialect:?} let through: {sql}\nrendered: {rendered}"),
        Err(error) => {
            assert!(
                error.message.starts_with("refused by rule '"),
                "{sql}: {}",
                error.message
            );
            refusal_rule(&error)
        }
    }
}

const BOTH: [SqlDialect; 2] = [SqlDialect::Sqlite, SqlDialect::Postgres];

#[test]
fn hostile_queries_are_refused_by_their_rule() {
    let hostile: &[(&str, &str)] = &[
        // Writes.
        ("INSERT INTO orders (id) VALUES (1)", rules::SQL_READ_ONLY),
        ("UPDATE orders SET total = 0", rules::SQL_READ_ONLY),
        ("DELETE FROM orders", rules::SQL_READ_ONLY),
        ("DROP TABLE orders", rules::SQL_READ_ONLY),
        ("CREATE TABLE x (a INT)", rules::SQL_READ_ONLY),
        ("ALTER TABLE orders ADD COLUMN x INT", rules::SQL_READ_ONLY),
        // Multiple statements, with comments between or hiding them.
        ("SELECT 1; DROP TABLE orders", rules::SQL_SINGLE_STATEMENT),
        (
            "SELECT 1; -- \n DROP TABLE orders",
            rules::SQL_SINGLE_STATEMENT,
        ),
        (
            "SELECT 1 /* ; */; /* x */ DELETE FROM orders",
            rules::SQL_SINGLE_STATEMENT,
        ),
        (
            "SELECT id FROM orders; SELECT 2",
            rules::SQL_SINGLE_STATEMENT,
        ),
        ("", rules::SQL_SINGLE_STATEMENT),
        ("-- only a comment", rules::SQL_SINGLE_STATEMENT),
        // CTE tricks.
        (
            "WITH gone AS (DELETE FROM orders RETURNING *) SELECT * FROM gone",
            rules::SQL_READ_ONLY,
        ),
        (
            "WITH x AS (SELECT secret FROM customers) SELECT * FROM x",
            rules::SQL_ALLOWED_COLUMNS,
        ),
        (
            "WITH customers AS (SELECT 1 AS id) SELECT * FROM customers",
            rules::SQL_ALLOWED_TABLES,
        ),
        (
            "WITH a AS (SELECT * FROM b), b AS (SELECT 1 AS id) SELECT * FROM a",
            rules::SQL_ALLOWED_TABLES,
        ),
        (
            "SELECT * FROM x WHERE 1 IN (WITH x AS (SELECT 1 AS id) SELECT id FROM x)",
            rules::SQL_ALLOWED_TABLES,
        ),
        // SELECT INTO and locks.
        ("SELECT id INTO copy FROM orders", rules::SQL_READ_ONLY),
        ("SELECT id FROM orders FOR UPDATE", rules::SQL_READ_ONLY),
        // Functions with side effects or outside reach.
        ("SELECT pg_sleep(10)", rules::SQL_ALLOWED_FUNCTIONS),
        (
            "SELECT id FROM orders WHERE pg_sleep(1) IS NULL",
            rules::SQL_ALLOWED_FUNCTIONS,
        ),
        (
            "SELECT pg_read_file('/etc/passwd')",
            rules::SQL_ALLOWED_FUNCTIONS,
        ),
        (
            "SELECT load_extension('/tmp/evil.so')",
            rules::SQL_ALLOWED_FUNCTIONS,
        ),
        (
            "SELECT randomblob(1000000000)",
            rules::SQL_ALLOWED_FUNCTIONS,
        ),
        (
            "SELECT dblink('host=evil', 'SELECT 1')",
            rules::SQL_ALLOWED_FUNCTIONS,
        ),
        (
            "SELECT lo_import('/etc/passwd')",
            rules::SQL_ALLOWED_FUNCTIONS,
        ),
        (
            "SELECT set_config('x', 'y', false)",
            rules::SQL_ALLOWED_FUNCTIONS,
        ),
        ("SELECT nextval('seq')", rules::SQL_ALLOWED_FUNCTIONS),
        (
            "SELECT current_setting('data_directory')",
            rules::SQL_ALLOWED_FUNCTIONS,
        ),
        (
            "SELECT pg_catalog.lower(name) FROM customers",
            rules::SQL_ALLOWED_FUNCTIONS,
        ),
        (
            "SELECT * FROM generate_series(1, 1000000000)",
            rules::SQL_ALLOWED_FUNCTIONS,
        ),
        // System catalogs.
        ("SELECT * FROM sqlite_master", rules::SQL_SYSTEM_CATALOG),
        ("SELECT sql FROM sqlite_schema", rules::SQL_SYSTEM_CATALOG),
        (
            "SELECT * FROM pg_catalog.pg_user",
            rules::SQL_SYSTEM_CATALOG,
        ),
        ("SELECT usename FROM pg_shadow", rules::SQL_SYSTEM_CATALOG),
        (
            "SELECT * FROM information_schema.columns",
            rules::SQL_SYSTEM_CATALOG,
        ),
        (
            "SELECT id FROM orders WHERE id IN (SELECT 1 FROM pg_tables)",
            rules::SQL_SYSTEM_CATALOG,
        ),
        (
            "SELECT * FROM pragma_table_info('customers')",
            rules::SQL_SYSTEM_CATALOG,
        ),
        (
            "SELECT CAST('pg_authid' AS regclass)",
            rules::SQL_SYSTEM_CATALOG,
        ),
        // Tables that are not declared, wherever they hide.
        ("SELECT * FROM audit", rules::SQL_ALLOWED_TABLES),
        (
            "SELECT id FROM orders WHERE id IN (SELECT id FROM audit)",
            rules::SQL_ALLOWED_TABLES,
        ),
        (
            "SELECT id FROM orders WHERE EXISTS (SELECT 1 FROM audit)",
            rules::SQL_ALLOWED_TABLES,
        ),
        (
            "SELECT id FROM orders UNION SELECT id FROM audit",
            rules::SQL_ALLOWED_TABLES,
        ),
        (
            "SELECT o.id FROM orders o JOIN audit a ON a.id = o.id",
            rules::SQL_ALLOWED_TABLES,
        ),
        (
            "SELECT * FROM (SELECT * FROM audit) AS x",
            rules::SQL_ALLOWED_TABLES,
        ),
        ("SELECT * FROM main.orders", rules::SQL_ALLOWED_TABLES),
        ("TABLE audit", rules::SQL_PARSE),
        // Columns that are not allowed, however named.
        ("SELECT secret FROM customers", rules::SQL_ALLOWED_COLUMNS),
        ("SELECT * FROM customers", rules::SQL_ALLOWED_COLUMNS),
        ("SELECT c.* FROM customers c", rules::SQL_ALLOWED_COLUMNS),
        (
            "SELECT c.secret AS name FROM customers AS c",
            rules::SQL_ALLOWED_COLUMNS,
        ),
        (
            "SELECT customers.email FROM customers",
            rules::SQL_ALLOWED_COLUMNS,
        ),
        (
            "SELECT name FROM customers WHERE secret LIKE 'a%'",
            rules::SQL_ALLOWED_COLUMNS,
        ),
        (
            "SELECT name FROM customers ORDER BY email",
            rules::SQL_ALLOWED_COLUMNS,
        ),
        (
            "SELECT count(*) FROM customers GROUP BY secret",
            rules::SQL_ALLOWED_COLUMNS,
        ),
        (
            "SELECT id AS secret FROM customers WHERE secret = 'x'",
            rules::SQL_ALLOWED_COLUMNS,
        ),
        ("SELECT SeCrEt FROM CUSTOMERS", rules::SQL_ALLOWED_COLUMNS),
        (
            "SELECT * FROM (SELECT * FROM customers) AS x",
            rules::SQL_ALLOWED_COLUMNS,
        ),
        (
            "SELECT o.id FROM orders o WHERE o.id IN (SELECT length(secret) FROM customers)",
            rules::SQL_ALLOWED_COLUMNS,
        ),
        (
            "SELECT id FROM orders UNION SELECT email FROM customers",
            rules::SQL_ALLOWED_COLUMNS,
        ),
        (
            "SELECT customers FROM customers",
            rules::SQL_ALLOWED_COLUMNS,
        ),
        (
            "SELECT count(c.*) FROM customers c",
            rules::SQL_ALLOWED_COLUMNS,
        ),
        (
            "SELECT o.id FROM orders o NATURAL JOIN customers",
            rules::SQL_ALLOWED_COLUMNS,
        ),
        (
            "SELECT o.id FROM orders o JOIN customers USING (secret)",
            rules::SQL_ALLOWED_COLUMNS,
        ),
        ("TABLE customers", rules::SQL_PARSE),
        (
            "SELECT id FROM orders WHERE id IN customers",
            rules::SQL_ALLOWED_COLUMNS,
        ),
        // Nesting past the parser's limit.
        (
            "SELECT ((((((((((((((((((((((((((((((((((((((((((((1))))))))))))))))))))))))))))))))))))))))))))",
            rules::SQL_PARSE,
        ),
        ("SELEC id FROM orders", rules::SQL_PARSE),
    ];
    let mut checked = vec![0; hostile.len()];
    for dialect in BOTH {
        for (position, (sql, expected)) in hostile.iter().enumerate() {
            // `IN table` is SQLite syntax, `TABLE t` and `INTO` parse differently by dialect:
            // each is checked where it parses as the attack it is.
            let rule = match check(dialect, sql) {
                Err(error)
                    if refusal_rule(&error) == Some(rules::SQL_PARSE)
                        && *expected != rules::SQL_PARSE =>
                {
                    continue;
                }
                _ => rule_of(dialect, sql),
            };
            assert_eq!(rule, Some(*expected), "{dialect:?}: {sql}");
            checked[position] += 1;
        }
    }
    // Each attack is refused by its rule in at least one dialect (elsewhere it does not parse).
    for ((sql, _), count) in hostile.iter().zip(checked) {
        assert!(count > 0, "checked in no dialect: {sql}");
    }
}

#[test]
fn dialect_specific_attacks_parse_and_are_refused() {
    // These must be refused as attacks, not merely as unparsable, in their own dialect.
    let postgres: &[(&str, &str)] = &[
        ("SELECT 'pg_authid'::regclass", rules::SQL_SYSTEM_CATALOG),
        ("SELECT id INTO copy FROM orders", rules::SQL_READ_ONLY),
        ("COPY orders TO '/tmp/x'", rules::SQL_READ_ONLY),
        ("GRANT ALL ON orders TO public", rules::SQL_READ_ONLY),
        (
            "SET default_transaction_read_only = off",
            rules::SQL_READ_ONLY,
        ),
        (
            "SELECT \"secret\" FROM customers",
            rules::SQL_ALLOWED_COLUMNS,
        ),
    ];
    for (sql, expected) in postgres {
        assert_eq!(rule_of(SqlDialect::Postgres, sql), Some(*expected), "{sql}");
    }
    let sqlite: &[(&str, &str)] = &[
        ("ATTACH DATABASE '/tmp/x.db' AS x", rules::SQL_READ_ONLY),
        ("PRAGMA query_only = 0", rules::SQL_READ_ONLY),
        (
            "SELECT id FROM orders WHERE id IN customers",
            rules::SQL_ALLOWED_COLUMNS,
        ),
        ("SELECT [secret] FROM customers", rules::SQL_ALLOWED_COLUMNS),
        // SQLite folds quoted names too (in PostgreSQL "SECRET" is another column).
        (
            "SELECT \"SECRET\" FROM customers",
            rules::SQL_ALLOWED_COLUMNS,
        ),
        ("SELECT `email` FROM customers", rules::SQL_ALLOWED_COLUMNS),
    ];
    for (sql, expected) in sqlite {
        assert_eq!(rule_of(SqlDialect::Sqlite, sql), Some(*expected), "{sql}");
    }
}

#[test]
fn ordinary_queries_pass_and_run_as_checked() {
    let fine = [
        "SELECT id, name FROM customers WHERE city = 'Lyon' ORDER BY name",
        "select c.name, count(*) AS n from customers c join orders o on o.customer_id = c.id group by c.name",
        "SELECT * FROM orders",
        "SELECT o.* FROM orders o",
        "WITH big AS (SELECT customer_id, sum(total) AS spent FROM orders GROUP BY customer_id) \
         SELECT c.name, big.spent FROM big JOIN customers c ON c.id = big.customer_id",
        "WITH RECURSIVE n(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM n WHERE k < 3) SELECT k FROM n",
        "SELECT name FROM customers WHERE id IN (SELECT customer_id FROM orders WHERE total > 10)",
        "SELECT upper(name), round(avg(total), 2) FROM customers c JOIN orders o ON o.customer_id = c.id GROUP BY upper(name)",
        "SELECT id FROM orders LIMIT 5",
        "SELECT CASE WHEN total > 100 THEN 'big' ELSE 'small' END AS size FROM orders",
        "SELECT id FROM orders;",
    ];
    for dialect in BOTH {
        for sql in fine {
            let rendered = check(dialect, sql)
                .unwrap_or_else(|error| panic!("{dialect:?} refused {sql}: {}", error.message));
            assert!(!rendered.contains(';'), "{rendered}");
        }
    }
    // What runs is the tree rendered back: comments are gone.
    let rendered = check(
        SqlDialect::Sqlite,
        "SELECT id /* hidden */ FROM orders -- end",
    )
    .unwrap();
    assert_eq!(rendered, "SELECT id FROM orders");
}

#[test]
fn refusals_name_what_is_wrong() {
    let error = check(SqlDialect::Sqlite, "SELECT secret FROM customers").unwrap_err();
    assert_eq!(
        error.message,
        "refused by rule 'sql-allowed-columns': the column 'secret' of 'customers' is not \
         allowed; the allowed columns are: city, id, name"
    );
    let error = check(SqlDialect::Postgres, "SELECT * FROM audit").unwrap_err();
    assert!(
        error.message.contains(
            "the table 'audit' is not declared; the declared tables are: customers, orders"
        ),
        "{}",
        error.message
    );
}

#[test]
fn only_restricted_tables_read_need_their_columns() {
    let guard = guard(SqlDialect::Sqlite);
    let parsed = guard.parse("SELECT id FROM orders").unwrap();
    assert!(parsed.restricted_tables().is_empty());
    let parsed = guard
        .parse("SELECT o.id FROM orders o JOIN customers c ON c.id = o.customer_id")
        .unwrap();
    assert_eq!(parsed.restricted_tables(), ["customers"]);
}

#[test]
fn postgres_quoted_identifiers_are_exact() {
    // In PostgreSQL, "Name" is another column than name: the allowed `name` does not let it by.
    let guard = SqlGuard::new(
        SqlDialect::Postgres,
        &[SqlTable::with_columns("people", ["name"])],
    );
    let schema = BTreeMap::from([(
        "people".to_owned(),
        vec!["name".to_owned(), "Name".to_owned()],
    )]);
    let refused = guard
        .parse("SELECT \"Name\" FROM people")
        .and_then(|parsed| parsed.check_columns(&schema))
        .unwrap_err();
    assert_eq!(refusal_rule(&refused), Some(rules::SQL_ALLOWED_COLUMNS));
    let passed = guard
        .parse("SELECT NAME FROM people")
        .and_then(|parsed| parsed.check_columns(&schema));
    assert!(passed.is_ok());
}

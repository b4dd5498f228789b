//! The SQL guard: what `loom.sql` checks before a query reaches a database.
//!
//! The model's SQL is parsed with `sqlparser` in the backend's dialect; a query passes only if
//! it is one read-only `SELECT` over the declared tables and columns, calling allowed functions
//! only. The checks, each refusal naming its rule ([`rules`](crate::rules)):
//!
//! - `sql-parse`: the text parses (nesting is bounded by the parser's recursion limit);
//! - `sql-single-statement`: exactly one statement, whatever comments sit between two;
//! - `sql-read-only`: the statement is a query, with no data-modifying CTE
//!   (`WITH x AS (DELETE …)`), no `SELECT … INTO`, no locking clause (`FOR UPDATE`);
//! - `sql-system-catalog`: no `sqlite_*` or `pragma_*` table, no `pg_*` or
//!   `information_schema` name, no cast to an object-identifier type (`::regclass`);
//! - `sql-allowed-tables`: every table is declared (or a CTE of an enclosing query, never named
//!   like a declared table, never referred to before it is defined);
//! - `sql-allowed-columns`: every column of a table with a column list is in it: unqualified
//!   names are checked against the real columns of every such table the query reads, qualified
//!   ones through the table's name and aliases; `*` and `t.*` only over tables without a column
//!   list; no whole-row reference, no `NATURAL` join over them;
//! - `sql-allowed-functions`: every function is on a short list of pure functions;
//! - `sql-allowed-syntax`: every expression and `FROM` item is of a kind the guard knows
//!   (anything else is refused rather than trusted).
//!
//! Checks run in two phases: [`SqlGuard::parse`] needs only the text, [`Parsed::check_columns`]
//! the real columns of the restricted tables the query reads ([`Parsed::restricted_tables`]),
//! which the tool reads from the database itself.

use std::{
    collections::{BTreeMap, BTreeSet},
    ops::ControlFlow,
};

use loom_core::tool::ToolError;
use sqlparser::{
    ast::{
        Expr, FunctionArg, FunctionArgExpr, FunctionArguments, Ident, InTarget, JoinConstraint,
        JoinOperator, ObjectName, ObjectNamePart, Query, Select, SelectItem,
        SelectItemQualifiedWildcardKind, SetExpr, Statement, TableFactor, TableWithJoins, Visit,
        Visitor,
    },
    dialect::{Dialect, PostgreSqlDialect, SQLiteDialect},
    parser::Parser,
};

use crate::{refusal, rules};

use functions::ALLOWED_FUNCTIONS;

/// How deep the parser may nest expressions and subqueries.
const RECURSION_LIMIT: usize = 40;

/// The SQL dialect of a database `loom.sql` queries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlDialect {
    /// SQLite: identifiers are case-insensitive, quoted or not.
    Sqlite,
    /// PostgreSQL: unquoted identifiers fold to lower case, quoted ones are exact.
    Postgres,
}

impl SqlDialect {
    fn dialect(self) -> Box<dyn Dialect> {
        match self {
            SqlDialect::Sqlite => Box::new(SQLiteDialect {}),
            SqlDialect::Postgres => Box::new(PostgreSqlDialect {}),
        }
    }

    /// An identifier as the database reads it.
    fn normalize(self, ident: &Ident) -> String {
        match (self, ident.quote_style) {
            (SqlDialect::Postgres, Some(_)) => ident.value.clone(),
            _ => ident.value.to_lowercase(),
        }
    }

    /// A declared name (a table or a column in the configuration, a real column read from the
    /// database) as identifiers are compared.
    fn declared(self, name: &str) -> String {
        match self {
            SqlDialect::Sqlite => name.to_lowercase(),
            SqlDialect::Postgres => name.to_owned(),
        }
    }
}

/// A table a guarded query may read, with the columns it may use (`None`: all of them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlTable {
    /// The table's name, as the database knows it (`orders`, `sales.orders`).
    pub name: String,
    /// The columns a query may use; `None` allows every column, and `*`.
    pub columns: Option<Vec<String>>,
}

impl SqlTable {
    /// A table whose every column may be read.
    pub fn all_columns(name: impl Into<String>) -> SqlTable {
        SqlTable {
            name: name.into(),
            columns: None,
        }
    }

    /// A table of which only `columns` may be used.
    pub fn with_columns(
        name: impl Into<String>,
        columns: impl IntoIterator<Item = impl Into<String>>,
    ) -> SqlTable {
        SqlTable {
            name: name.into(),
            columns: Some(columns.into_iter().map(Into::into).collect()),
        }
    }
}

/// A declared table, its names as compared.
#[derive(Debug)]
struct Allowed {
    /// The configured name.
    name: String,
    /// The name as compared (normalized for the dialect).
    key: String,
    /// The last part of the name (`orders` of `sales.orders`), as compared.
    last: String,
    /// The allowed columns as compared, `None` for all.
    columns: Option<BTreeSet<String>>,
}

/// The SQL guard over declared tables in one dialect.
#[derive(Debug)]
pub struct SqlGuard {
    dialect: SqlDialect,
    tables: Vec<Allowed>,
}

/// A query that passed the first phase of the guard: parsed, one read-only `SELECT` over
/// declared tables calling allowed functions. [`Parsed::check_columns`] finishes the checks.
#[derive(Debug)]
pub struct Parsed<'g> {
    guard: &'g SqlGuard,
    query: Box<Query>,
    /// Indexes into `guard.tables` of the restricted tables the query reads, with their aliases.
    restricted: BTreeMap<usize, BTreeSet<String>>,
}

/// A query that passed every check, rendered back from its syntax tree: what runs is what was
/// checked, never the model's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardedQuery {
    /// The query's SQL, without a trailing `;`.
    pub sql: String,
}

impl SqlGuard {
    /// A guard allowing `tables` in `dialect`.
    pub fn new(dialect: SqlDialect, tables: &[SqlTable]) -> SqlGuard {
        let tables = tables
            .iter()
            .map(|table| {
                let key = dialect.declared(&table.name);
                let last = key.rsplit('.').next().unwrap_or(&key).to_owned();
                Allowed {
                    name: table.name.clone(),
                    key,
                    last,
                    columns: table.columns.as_ref().map(|columns| {
                        columns
                            .iter()
                            .map(|column| dialect.declared(column))
                            .collect()
                    }),
                }
            })
            .collect();
        SqlGuard { dialect, tables }
    }

    /// The guard's dialect.
    pub fn dialect(&self) -> SqlDialect {
        self.dialect
    }

    /// The first phase: parses `sql` and checks everything but the columns of unqualified names.
    ///
    /// # Errors
    /// A refusal naming its rule.
    pub fn parse(&self, sql: &str) -> Result<Parsed<'_>, ToolError> {
        let dialect = self.dialect.dialect();
        let statements = Parser::new(dialect.as_ref())
            .with_recursion_limit(RECURSION_LIMIT)
            .try_with_sql(sql)
            .and_then(|mut parser| parser.parse_statements())
            .map_err(|error| {
                refusal(rules::SQL_PARSE, format!("the SQL does not parse: {error}"))
            })?;
        let mut statements = statements.into_iter();
        let (Some(statement), None) = (statements.next(), statements.next()) else {
            return Err(refusal(
                rules::SQL_SINGLE_STATEMENT,
                "send exactly one SELECT statement (no ';'-separated statements)",
            ));
        };
        let Statement::Query(query) = statement else {
            return Err(refusal(
                rules::SQL_READ_ONLY,
                format!(
                    "only a SELECT query is allowed; this is a {} statement",
                    statement_kind(&statement)
                ),
            ));
        };
        let mut collect = Collect {
            guard: self,
            restricted: BTreeMap::new(),
        };
        let _ = query.visit(&mut collect);
        let restricted = collect.restricted;
        let mut check = Check {
            guard: self,
            restricted: &restricted,
            scopes: Vec::new(),
            schema: None,
        };
        if let ControlFlow::Break(error) = query.visit(&mut check) {
            return Err(error);
        }
        Ok(Parsed {
            guard: self,
            query,
            restricted,
        })
    }

    fn table(&self, name: &ObjectName) -> Option<usize> {
        let key = self.object_key(name)?;
        self.tables.iter().position(|table| table.key == key)
    }

    /// A name's parts as compared, joined by `.`; `None` when a part is not an identifier.
    fn object_key(&self, name: &ObjectName) -> Option<String> {
        let parts: Option<Vec<String>> = name
            .0
            .iter()
            .map(|part| match part {
                ObjectNamePart::Identifier(ident) => Some(self.dialect.normalize(ident)),
                ObjectNamePart::Function(_) => None,
            })
            .collect();
        parts.map(|parts| parts.join("."))
    }

    fn declared_names(&self) -> String {
        let names: Vec<&str> = self.tables.iter().map(|t| t.name.as_str()).collect();
        names.join(", ")
    }
}

impl Parsed<'_> {
    /// The restricted tables (with a column list) the query reads, by their configured names:
    /// the tables whose real columns [`Parsed::check_columns`] needs.
    pub fn restricted_tables(&self) -> Vec<&str> {
        self.restricted
            .keys()
            .map(|&index| self.guard.tables[index].name.as_str())
            .collect()
    }

    /// The second phase: checks every column name against the allowed columns, given the real
    /// columns of each restricted table (`schema`, by configured name; a table missing there
    /// is taken to have no column, so only its qualified names are checked).
    ///
    /// # Errors
    /// A refusal naming its rule.
    pub fn check_columns(
        self,
        schema: &BTreeMap<String, Vec<String>>,
    ) -> Result<GuardedQuery, ToolError> {
        let real: BTreeMap<usize, BTreeSet<String>> = self
            .restricted
            .keys()
            .map(|&index| {
                let table = &self.guard.tables[index];
                let columns = schema
                    .get(&table.name)
                    .into_iter()
                    .flatten()
                    .map(|column| self.guard.dialect.declared(column))
                    .collect();
                (index, columns)
            })
            .collect();
        let mut check = Check {
            guard: self.guard,
            restricted: &self.restricted,
            scopes: Vec::new(),
            schema: Some(&real),
        };
        if let ControlFlow::Break(error) = self.query.visit(&mut check) {
            return Err(error);
        }
        Ok(GuardedQuery {
            sql: self.query.to_string(),
        })
    }
}

/// The first pass: which restricted tables the query reads, and under which aliases.
struct Collect<'g> {
    guard: &'g SqlGuard,
    restricted: BTreeMap<usize, BTreeSet<String>>,
}

impl Collect<'_> {
    fn note(&mut self, name: &ObjectName, alias: Option<&Ident>) {
        let Some(index) = self.guard.table(name) else {
            return;
        };
        if self.guard.tables[index].columns.is_none() {
            return;
        }
        let aliases = self.restricted.entry(index).or_default();
        if let Some(alias) = alias {
            aliases.insert(self.guard.dialect.normalize(alias));
        }
    }
}

impl Visitor for Collect<'_> {
    type Break = ();

    fn pre_visit_table_factor(&mut self, factor: &TableFactor) -> ControlFlow<()> {
        if let TableFactor::Table { name, alias, .. } = factor {
            self.note(name, alias.as_ref().map(|alias| &alias.name));
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_relation(&mut self, relation: &ObjectName) -> ControlFlow<()> {
        self.note(relation, None);
        ControlFlow::Continue(())
    }

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<()> {
        for_each_set_table(&query.body, &mut |name| self.note(&name, None));
        ControlFlow::Continue(())
    }
}

/// The tables a set expression names with `TABLE t` (outside any nested query).
fn for_each_set_table(body: &SetExpr, each: &mut dyn FnMut(ObjectName)) {
    match body {
        SetExpr::Table(table) => {
            let parts: Vec<Ident> = table
                .schema_name
                .iter()
                .chain(table.table_name.iter())
                .cloned()
                .collect();
            each(ObjectName::from(parts));
        }
        SetExpr::SetOperation { left, right, .. } => {
            for_each_set_table(left, each);
            for_each_set_table(right, each);
        }
        _ => {}
    }
}

/// The second pass: every rule, over the syntax tree. Without `schema`, unqualified column
/// names are not checked yet.
struct Check<'a> {
    guard: &'a SqlGuard,
    restricted: &'a BTreeMap<usize, BTreeSet<String>>,
    /// The CTE names visible, one entry per enclosing query.
    scopes: Vec<Vec<String>>,
    /// The real columns of each restricted table, once read.
    schema: Option<&'a BTreeMap<usize, BTreeSet<String>>>,
}

type Flow = ControlFlow<ToolError>;

fn refuse(rule: &'static str, detail: impl std::fmt::Display) -> Flow {
    ControlFlow::Break(refusal(rule, detail))
}

impl Check<'_> {
    fn in_scope(&self, key: &str) -> bool {
        self.scopes.iter().flatten().any(|name| name == key)
    }

    /// A table read by name: a catalog is refused, a CTE in scope passes, anything else must
    /// be declared.
    fn relation(&self, name: &ObjectName) -> Flow {
        let Some(key) = self.guard.object_key(name) else {
            return refuse(
                rules::SQL_ALLOWED_SYNTAX,
                format!("the table name '{name}' is computed; name a declared table"),
            );
        };
        self.catalog(name)?;
        if !key.contains('.') && self.in_scope(&key) {
            return ControlFlow::Continue(());
        }
        if self.guard.table(name).is_none() {
            return refuse(
                rules::SQL_ALLOWED_TABLES,
                format!(
                    "the table '{name}' is not declared; the declared tables are: {}",
                    self.guard.declared_names()
                ),
            );
        }
        ControlFlow::Continue(())
    }

    /// A system catalog is refused, whatever part of the name says so.
    fn catalog(&self, name: &ObjectName) -> Flow {
        if name.0.iter().any(|part| is_catalog(&part.to_string())) {
            return refuse(
                rules::SQL_SYSTEM_CATALOG,
                format!("'{name}' is a system catalog, which a guarded query may not read"),
            );
        }
        ControlFlow::Continue(())
    }

    /// `*` over a declared table: only when all its columns are allowed.
    fn star_over(&self, name: &ObjectName, shown: &str) -> Flow {
        if let Some(index) = self.guard.table(name)
            && self.guard.tables[index].columns.is_some()
        {
            let key = self.guard.object_key(name).unwrap_or_default();
            if key.contains('.') || !self.in_scope(&key) {
                return self.star_refused(index, shown);
            }
        }
        ControlFlow::Continue(())
    }

    fn star_refused(&self, index: usize, shown: &str) -> Flow {
        let table = &self.guard.tables[index];
        refuse(
            rules::SQL_ALLOWED_COLUMNS,
            format!(
                "'{shown}' would read every column of '{}', of which only these are allowed: {}; \
                 name the columns",
                table.name,
                allowed_list(table)
            ),
        )
    }

    /// The restricted tables a qualifier (`t`, `s.t`, an alias) may stand for.
    fn qualified(&self, qualifier: &[Ident]) -> Vec<usize> {
        let Some(last) = qualifier.last() else {
            return Vec::new();
        };
        let last = self.guard.dialect.normalize(last);
        self.restricted
            .iter()
            .filter(|(index, aliases)| {
                self.guard.tables[**index].last == last || aliases.contains(&last)
            })
            .map(|(index, _)| *index)
            .collect()
    }

    fn column(&self, index: usize, column: &str, shown: &str) -> Flow {
        let table = &self.guard.tables[index];
        match &table.columns {
            Some(allowed) if !allowed.contains(column) => refuse(
                rules::SQL_ALLOWED_COLUMNS,
                format!(
                    "the column '{shown}' of '{}' is not allowed; the allowed columns are: {}",
                    table.name,
                    allowed_list(table)
                ),
            ),
            _ => ControlFlow::Continue(()),
        }
    }

    /// An unqualified name: a whole-row reference to a restricted table is refused; once the
    /// real columns are known, a column of a restricted table must be allowed.
    fn unqualified(&self, ident: &Ident) -> Flow {
        let key = self.guard.dialect.normalize(ident);
        for (index, aliases) in self.restricted {
            let table = &self.guard.tables[*index];
            if table.last == key || aliases.contains(&key) {
                return refuse(
                    rules::SQL_ALLOWED_COLUMNS,
                    format!(
                        "'{ident}' names a whole row of '{}', of which only these columns are \
                         allowed: {}",
                        table.name,
                        allowed_list(table)
                    ),
                );
            }
            if let Some(schema) = self.schema
                && schema.get(index).is_some_and(|real| real.contains(&key))
            {
                self.column(*index, &key, &ident.value)?;
            }
        }
        ControlFlow::Continue(())
    }

    fn compound(&self, parts: &[Ident]) -> Flow {
        let Some((column, qualifier)) = parts.split_last() else {
            return ControlFlow::Continue(());
        };
        let key = self.guard.dialect.normalize(column);
        let shown: Vec<&str> = parts.iter().map(|part| part.value.as_str()).collect();
        for index in self.qualified(qualifier) {
            self.column(index, &key, &shown.join("."))?;
        }
        ControlFlow::Continue(())
    }

    fn function(&self, function: &sqlparser::ast::Function) -> Flow {
        let name = match function.name.0.as_slice() {
            [ObjectNamePart::Identifier(ident)] => self.guard.dialect.normalize(ident),
            _ => {
                return refuse(
                    rules::SQL_ALLOWED_FUNCTIONS,
                    format!(
                        "the function '{}' is not allowed (qualified names are refused)",
                        function.name
                    ),
                );
            }
        };
        if !ALLOWED_FUNCTIONS.contains(&name.as_str()) {
            return refuse(
                rules::SQL_ALLOWED_FUNCTIONS,
                format!(
                    "the function '{}' is not allowed; the allowed functions are: {}",
                    function.name,
                    ALLOWED_FUNCTIONS.join(", ")
                ),
            );
        }
        if let FunctionArguments::List(list) = &function.args {
            for arg in &list.args {
                let expr = match arg {
                    FunctionArg::Named { arg, .. }
                    | FunctionArg::ExprNamed { arg, .. }
                    | FunctionArg::Unnamed(arg) => arg,
                };
                if let FunctionArgExpr::QualifiedWildcard(name) = expr {
                    self.star_over(name, &format!("{name}.*"))?;
                    for index in self.qualified(&idents(name)) {
                        self.star_refused(index, &format!("{name}.*"))?;
                    }
                }
            }
        }
        ControlFlow::Continue(())
    }

    /// The `FROM` items of a select, their join constraints and its `*`.
    fn select(&self, select: &Select) -> Flow {
        if let Some(into) = &select.into {
            return refuse(rules::SQL_READ_ONLY, format!("'{into}' writes a table"));
        }
        let mut direct = Vec::new();
        for from in &select.from {
            self.joined(from, &mut direct)?;
        }
        for item in &select.projection {
            match item {
                SelectItem::Wildcard(_) => {
                    for name in &direct {
                        self.star_over(name, "*")?;
                    }
                }
                SelectItem::QualifiedWildcard(kind, _) => {
                    let SelectItemQualifiedWildcardKind::ObjectName(name) = kind else {
                        return refuse(
                            rules::SQL_ALLOWED_SYNTAX,
                            format!("'{kind}' is not allowed"),
                        );
                    };
                    self.star_over(name, &format!("{name}.*"))?;
                    for index in self.qualified(&idents(name)) {
                        self.star_refused(index, &format!("{name}.*"))?;
                    }
                }
                _ => {}
            }
        }
        ControlFlow::Continue(())
    }

    fn joined(&self, from: &TableWithJoins, direct: &mut Vec<ObjectName>) -> Flow {
        self.factor(&from.relation, direct)?;
        for join in &from.joins {
            self.factor(&join.relation, direct)?;
            let constraint = match &join.join_operator {
                JoinOperator::Join(c)
                | JoinOperator::Inner(c)
                | JoinOperator::Left(c)
                | JoinOperator::LeftOuter(c)
                | JoinOperator::Right(c)
                | JoinOperator::RightOuter(c)
                | JoinOperator::FullOuter(c)
                | JoinOperator::CrossJoin(c)
                | JoinOperator::Semi(c)
                | JoinOperator::LeftSemi(c)
                | JoinOperator::RightSemi(c)
                | JoinOperator::Anti(c)
                | JoinOperator::LeftAnti(c)
                | JoinOperator::RightAnti(c) => c,
                other => {
                    return refuse(
                        rules::SQL_ALLOWED_SYNTAX,
                        format!("the join '{other:?}' is not allowed"),
                    );
                }
            };
            match constraint {
                JoinConstraint::Natural if !self.restricted.is_empty() => {
                    return refuse(
                        rules::SQL_ALLOWED_COLUMNS,
                        "a NATURAL join compares columns by name, including columns that are \
                         not allowed; join with ON",
                    );
                }
                JoinConstraint::Using(names) | JoinConstraint::UsingAlias(names, _) => {
                    for name in names {
                        match idents(name).as_slice() {
                            [ident] => self.unqualified(ident)?,
                            parts => self.compound(parts)?,
                        }
                    }
                }
                _ => {}
            }
        }
        ControlFlow::Continue(())
    }

    fn factor(&self, factor: &TableFactor, direct: &mut Vec<ObjectName>) -> Flow {
        match factor {
            TableFactor::Table { name, args, .. } => {
                if args.is_some() {
                    // A catalog read through a table function (`pragma_table_info(…)`) is
                    // named as such.
                    self.catalog(name)?;
                    return refuse(
                        rules::SQL_ALLOWED_FUNCTIONS,
                        format!("the table function '{name}' is not allowed"),
                    );
                }
                direct.push(name.clone());
                ControlFlow::Continue(())
            }
            TableFactor::Derived { .. } => ControlFlow::Continue(()),
            TableFactor::NestedJoin {
                table_with_joins, ..
            } => self.joined(table_with_joins, direct),
            other => refuse(
                rules::SQL_ALLOWED_SYNTAX,
                format!("the FROM item '{other}' is not allowed; read declared tables"),
            ),
        }
    }

    /// A query's own parts: its body's kind, its locking clause, its CTEs.
    fn query(&mut self, query: &Query) -> Flow {
        if !query.locks.is_empty() {
            return refuse(
                rules::SQL_READ_ONLY,
                "a locking clause (FOR UPDATE, FOR SHARE) is not allowed",
            );
        }
        self.body(&query.body)?;
        let mut names = Vec::new();
        if let Some(with) = &query.with {
            for cte in &with.cte_tables {
                let key = self.guard.dialect.normalize(&cte.alias.name);
                if self
                    .guard
                    .tables
                    .iter()
                    .any(|t| t.key == key || t.last == key)
                    || self.in_scope(&key)
                    || names.contains(&key)
                {
                    return refuse(
                        rules::SQL_ALLOWED_TABLES,
                        format!(
                            "the CTE '{}' is named like a table or another CTE; give it its \
                             own name",
                            cte.alias.name
                        ),
                    );
                }
                names.push(key);
            }
            if !with.recursive {
                // Without RECURSIVE, a CTE sees only those before it: a later name there would
                // be a table of the database.
                for (position, cte) in with.cte_tables.iter().enumerate() {
                    let later = &names[position..];
                    let mut forward = None;
                    let _ = sqlparser::ast::visit_relations(&cte.query, |relation| {
                        if let Some(key) = self.guard.object_key(relation)
                            && later.contains(&key)
                        {
                            forward = Some(relation.to_string());
                            return ControlFlow::Break(());
                        }
                        ControlFlow::Continue(())
                    });
                    if let Some(name) = forward {
                        return refuse(
                            rules::SQL_ALLOWED_TABLES,
                            format!(
                                "the CTE '{}' reads '{name}', which is not defined before it \
                                 (use WITH RECURSIVE)",
                                cte.alias.name
                            ),
                        );
                    }
                }
            }
        }
        self.scopes.push(names);
        ControlFlow::Continue(())
    }

    fn body(&self, body: &SetExpr) -> Flow {
        match body {
            SetExpr::Select(_) | SetExpr::Query(_) | SetExpr::Values(_) => {
                ControlFlow::Continue(())
            }
            SetExpr::SetOperation { left, right, .. } => {
                self.body(left)?;
                self.body(right)
            }
            SetExpr::Table(_) => {
                let mut result = ControlFlow::Continue(());
                for_each_set_table(body, &mut |name| {
                    if result.is_continue() {
                        result = match self.relation(&name) {
                            ControlFlow::Continue(()) => {
                                self.star_over(&name, &format!("TABLE {name}"))
                            }
                            refused => refused,
                        };
                    }
                });
                result
            }
            SetExpr::Insert(_) | SetExpr::Update(_) | SetExpr::Delete(_) | SetExpr::Merge(_) => {
                refuse(
                    rules::SQL_READ_ONLY,
                    format!("'{body}' modifies data; only SELECT is allowed"),
                )
            }
        }
    }

    fn expr(&self, expr: &Expr) -> Flow {
        match expr {
            Expr::Identifier(ident) => self.unqualified(ident),
            Expr::CompoundIdentifier(parts) => self.compound(parts),
            Expr::Function(function) => self.function(function),
            Expr::Cast { data_type, .. } => catalog_type(&data_type.to_string()),
            Expr::TypedString(typed) => catalog_type(&typed.data_type.to_string()),
            Expr::In { target, .. } => {
                if let InTarget::Table { name, args } = target {
                    if args.is_some() {
                        return refuse(
                            rules::SQL_ALLOWED_FUNCTIONS,
                            format!("the table function '{name}' is not allowed"),
                        );
                    }
                    return self.star_over(name, &format!("IN {name}"));
                }
                ControlFlow::Continue(())
            }
            Expr::IsFalse(_)
            | Expr::IsNotFalse(_)
            | Expr::IsTrue(_)
            | Expr::IsNotTrue(_)
            | Expr::IsNull(_)
            | Expr::IsNotNull(_)
            | Expr::IsUnknown(_)
            | Expr::IsNotUnknown(_)
            | Expr::IsDistinctFrom(..)
            | Expr::IsNotDistinctFrom(..)
            | Expr::Between { .. }
            | Expr::BinaryOp { .. }
            | Expr::Like { .. }
            | Expr::ILike { .. }
            | Expr::SimilarTo { .. }
            | Expr::AnyOp { .. }
            | Expr::AllOp { .. }
            | Expr::UnaryOp { .. }
            | Expr::AtTimeZone { .. }
            | Expr::Extract { .. }
            | Expr::Ceil { .. }
            | Expr::Floor { .. }
            | Expr::Position { .. }
            | Expr::Substring { .. }
            | Expr::Trim { .. }
            | Expr::Collate { .. }
            | Expr::Nested(_)
            | Expr::Value(_)
            | Expr::Case { .. }
            | Expr::Exists { .. }
            | Expr::Subquery(_)
            | Expr::GroupingSets(_)
            | Expr::Cube(_)
            | Expr::Rollup(_)
            | Expr::Tuple(_)
            | Expr::Interval(_) => ControlFlow::Continue(()),
            other => refuse(
                rules::SQL_ALLOWED_SYNTAX,
                format!("the expression '{other}' is not allowed in a guarded query"),
            ),
        }
    }
}

impl Visitor for Check<'_> {
    type Break = ToolError;

    fn pre_visit_statement(&mut self, statement: &Statement) -> Flow {
        // The top statement is the query itself; any statement inside it writes.
        refuse(
            rules::SQL_READ_ONLY,
            format!(
                "a {} statement inside the query is not allowed",
                statement_kind(statement)
            ),
        )
    }

    fn pre_visit_query(&mut self, query: &Query) -> Flow {
        self.query(query)
    }

    fn post_visit_query(&mut self, _query: &Query) -> Flow {
        self.scopes.pop();
        ControlFlow::Continue(())
    }

    fn pre_visit_select(&mut self, select: &Select) -> Flow {
        self.select(select)
    }

    fn pre_visit_relation(&mut self, relation: &ObjectName) -> Flow {
        self.relation(relation)
    }

    fn pre_visit_expr(&mut self, expr: &Expr) -> Flow {
        self.expr(expr)
    }
}

/// Whether a name part is a system catalog of SQLite or PostgreSQL.
fn is_catalog(part: &str) -> bool {
    let part = part.to_lowercase();
    part.starts_with("sqlite_")
        || part.starts_with("pragma_")
        || part.starts_with("pg_")
        || part == "information_schema"
}

/// A cast to an object-identifier type (`regclass`, `regproc`, …) reads the catalogs.
fn catalog_type(data_type: &str) -> Flow {
    let lower = data_type.to_lowercase();
    if lower.starts_with("reg") || lower.starts_with("pg_") {
        return refuse(
            rules::SQL_SYSTEM_CATALOG,
            format!("a cast to '{data_type}' reads the system catalogs"),
        );
    }
    ControlFlow::Continue(())
}

fn idents(name: &ObjectName) -> Vec<Ident> {
    name.0
        .iter()
        .filter_map(|part| match part {
            ObjectNamePart::Identifier(ident) => Some(ident.clone()),
            ObjectNamePart::Function(_) => None,
        })
        .collect()
}

fn allowed_list(table: &Allowed) -> String {
    match &table.columns {
        Some(columns) => columns.iter().cloned().collect::<Vec<_>>().join(", "),
        None => "all".to_owned(),
    }
}

/// The kind of a statement, for messages (`INSERT`, `DROP`, …): its first words.
fn statement_kind(statement: &Statement) -> String {
    let text = statement.to_string();
    let words: Vec<&str> = text.split_whitespace().take(2).collect();
    match words.as_slice() {
        [first, second] if matches!(*first, "CREATE" | "DROP" | "ALTER") => {
            format!("{first} {second}")
        }
        [first, ..] => (*first).to_owned(),
        [] => "empty".to_owned(),
    }
}

mod functions;

#[cfg(test)]
mod tests;

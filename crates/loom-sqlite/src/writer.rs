//! Group commit: the appends of concurrent runs share one write transaction and one sync.
//!
//! Every append goes through one connection of its own, the writer, held by one caller at a
//! time. A caller queues its batch, then waits for the writer. Whoever holds it (the group's
//! leader) takes every batch queued so far, its own and those of the callers waiting behind it,
//! writes them in one `BEGIN IMMEDIATE` transaction, commits once (one WAL sync when any batch
//! [must be synced](loom_core::event::must_sync)), and only then answers each caller. A caller
//! whose batch a leader already committed finds its answer when its turn comes and returns at
//! once. So under load a hundred runs' appends cost one sync, and no caller ever learns its
//! batch is written before the sync that covers it has returned.
//!
//! Each batch keeps its own outcome: it is one `INSERT` of its own, which checks the journal's
//! last seq as it writes (and writes nothing when it is not the expected one), so a conflict or a
//! failed insert refuses that batch alone (SQLite undoes a failed statement, not the transaction)
//! and the others commit. A failed commit fails every batch of the group. A group of one batch
//! (a run appending alone, the common case) is that `INSERT` alone, in SQLite's own transaction
//! of one statement: one hand-off to the connection's thread instead of three.
//!
//! The writer's page cache stays valid from one transaction to the next (no other connection of
//! the process writes events), which is most of what an append reads.

use loom_core::{
    event::{Event, must_sync},
    journal::{Batch, Line, conflict},
    ports::StoreError,
};
use sqlx::{
    Connection, Row, SqliteConnection,
    sqlite::{SqliteArguments, SqliteConnectOptions},
};
use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard, oneshot};

use crate::store::{BEGIN_FULL, BEGIN_NORMAL, Columns, db_error, to_sql};

/// Rows per `INSERT` statement (14 bound values each, under SQLite's 32,766).
const ROWS_PER_INSERT: usize = 500;

/// The columns of a row of `events`, in the order of [`insert_sql`]'s values.
const COLUMNS: &str = "INSERT INTO events (tenant_id, session_id, seq, event_id, ts, run_id, \
     root_run_id, type, category, status, agent, role, facets, event, ingested) ";

/// A batch waiting for a group.
pub(crate) struct Pending {
    batch: Batch,
    rows: Vec<Columns>,
    expected: u64,
    tenant_id: String,
    session_id: String,
    answer: oneshot::Sender<Result<Vec<Event>, StoreError>>,
}

/// The writer connection and the queue of batches waiting for it.
#[derive(Debug, Default)]
pub(crate) struct Writer {
    queue: std::sync::Mutex<Vec<Pending>>,
    conn: Mutex<Option<WriterConnection>>,
    /// Groups committed (read by tests).
    groups: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("tenant_id", &self.tenant_id)
            .field("session_id", &self.session_id)
            .field("events", &self.batch.len())
            .field("expected", &self.expected)
            .finish()
    }
}

impl Pending {
    /// Writes the batch through `conn` (its own statements: a conflict or a failed insert
    /// writes nothing of it): the caller's answer, and the outcome to send it.
    async fn write(self, conn: &mut SqliteConnection, path: &std::path::Path) -> Answer {
        let Pending {
            mut batch,
            rows,
            expected,
            tenant_id,
            session_id,
            answer,
        } = self;
        let result = async {
            batch.assign_seq(expected);
            let (events, lines) = batch.into_parts();
            let journal = Journal {
                tenant_id: &tenant_id,
                session_id: &session_id,
                expected,
            };
            if !insert(conn, path, &events, rows, lines, &journal).await? {
                let found = last_seq(conn, &journal)
                    .await
                    .map_err(|err| db_error(path, err))?;
                return Err(conflict(&tenant_id, &session_id, expected, found));
            }
            Ok(events)
        }
        .await;
        (answer, result)
    }
}

impl Writer {
    /// Appends `batch` (checked, with its lines; its rows' columns `rows`) after `expected`, in
    /// the next group: returns once the group's commit covers it.
    pub(crate) async fn append(
        &self,
        options: &SqliteConnectOptions,
        path: &std::path::Path,
        batch: Batch,
        rows: Vec<Columns>,
        expected: u64,
    ) -> Result<Vec<Event>, StoreError> {
        let (answer, mut answered) = oneshot::channel();
        let (tenant_id, session_id) = (batch.tenant_id.clone(), batch.session_id.clone());
        self.queue_lock().push(Pending {
            batch,
            rows,
            expected,
            tenant_id,
            session_id,
            answer,
        });
        let mut conn = self.conn.lock().await;
        match answered.try_recv() {
            // A leader before us wrote it.
            Ok(result) => return result,
            // A leader took it and was cancelled before answering: whether it was committed is
            // unknown to this caller (the journal tells, on the next read).
            Err(oneshot::error::TryRecvError::Closed) => return Err(interrupted(path)),
            // Still queued: this caller leads the next group.
            Err(oneshot::error::TryRecvError::Empty) => {}
        }
        let group = std::mem::take(&mut *self.queue_lock());
        self.commit_group(&mut conn, options, path, group).await;
        drop(conn);
        answered.await.unwrap_or_else(|_| Err(interrupted(path)))
    }

    /// The writer's connection for a read, when no append holds or waits for it and it is
    /// open: a read there finds the pages the last appends wrote in the connection's own cache,
    /// where a connection of the pool must read again every page the writer's commits changed.
    pub(crate) fn idle(&self) -> Option<MappedMutexGuard<'_, SqliteConnection>> {
        let guard = self.conn.try_lock().ok()?;
        MutexGuard::try_map(guard, |slot| slot.as_mut().map(|writer| &mut writer.conn)).ok()
    }

    /// Puts `conn` (the one the file was set up on) in place as the writer connection, unless
    /// one is open already; it is set to FULL (see `connect_options`).
    pub(crate) async fn adopt(&self, conn: SqliteConnection) {
        let mut slot = self.conn.lock().await;
        if slot.is_none() {
            *slot = Some(WriterConnection {
                conn,
                full: Some(true),
            });
        }
    }

    /// Closes the writer connection (the store is closing).
    pub(crate) async fn close(&self) {
        if let Some(writer) = self.conn.lock().await.take()
            && let Err(err) = writer.conn.close().await
        {
            tracing::debug!(error = %err, "closing the SQLite writer connection failed");
        }
    }

    fn queue_lock(&self) -> std::sync::MutexGuard<'_, Vec<Pending>> {
        // The queue is only pushed to and swapped: a panic elsewhere cannot leave it half-done.
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Writes `group` in one transaction and answers each of its callers.
    async fn commit_group(
        &self,
        slot: &mut Option<WriterConnection>,
        options: &SqliteConnectOptions,
        path: &std::path::Path,
        group: Vec<Pending>,
    ) {
        let writer = match slot {
            Some(writer) => writer,
            None => match SqliteConnection::connect_with(options).await {
                // Connections open FULL (see `connect_options`).
                Ok(conn) => slot.insert(WriterConnection {
                    conn,
                    full: Some(true),
                }),
                Err(err) => {
                    let message = err.to_string();
                    for pending in group {
                        let _ = pending.answer.send(Err(failed(path, &message)));
                    }
                    return;
                }
            },
        };
        let outcome = match <[Pending; 1]>::try_from(group) {
            Ok([alone]) if alone.batch.len() <= ROWS_PER_INSERT => {
                let (answer, result) = write_alone(writer, path, alone).await;
                Ok(vec![(answer, result)])
            }
            Ok(group) => write_group(writer, path, group.into()).await,
            Err(group) => write_group(writer, path, group).await,
        };
        self.groups
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match outcome {
            Ok(answers) => {
                for (pending, result) in answers {
                    let _ = pending.send(result);
                }
            }
            Err((answers, message)) => {
                // Nothing of the group was committed: every batch fails, a conflict staying a
                // conflict (it wrote nothing either way).
                for (pending, result) in answers {
                    let result = match result {
                        Err(err @ StoreError::Conflict { .. }) => Err(err),
                        _ => Err(failed(path, &message)),
                    };
                    let _ = pending.send(result);
                }
            }
        }
    }
}

/// The writer's connection, and the sync level it is set to (`PRAGMA synchronous`: FULL or
/// NORMAL), which stays from one write to the next: `None` when a failed statement leaves it
/// unknown.
#[derive(Debug)]
pub(crate) struct WriterConnection {
    conn: SqliteConnection,
    full: Option<bool>,
}

/// A caller's answer channel, and the outcome of its batch to send on it.
type Answer = (
    oneshot::Sender<Result<Vec<Event>, StoreError>>,
    Result<Vec<Event>, StoreError>,
);

type Answers = Vec<Answer>;

/// Writes a group of one batch that one `INSERT` holds: that statement alone, outside any
/// explicit transaction (SQLite runs a writing statement in a transaction of its own, which
/// takes the write lock at its start like `BEGIN IMMEDIATE` and commits at its end), after a
/// `PRAGMA synchronous` only when the batch needs another sync level than the connection has.
/// One statement where a transaction takes three: the common case of one run appending alone.
async fn write_alone(
    writer: &mut WriterConnection,
    path: &std::path::Path,
    pending: Pending,
) -> Answer {
    let full = must_sync(pending.batch.events());
    if writer.full != Some(full) {
        let pragma = if full {
            "PRAGMA synchronous = FULL"
        } else {
            "PRAGMA synchronous = NORMAL"
        };
        writer.full = None;
        if let Err(err) = sqlx::query(pragma).execute(&mut writer.conn).await {
            return (pending.answer, Err(db_error(path, err)));
        }
        writer.full = Some(full);
    }
    pending.write(&mut writer.conn, path).await
}

/// Writes every batch of `group` in one transaction: `Ok` with each batch's outcome once the
/// commit returned, `Err` with the outcomes and why when the transaction did not commit.
async fn write_group(
    writer: &mut WriterConnection,
    path: &std::path::Path,
    group: Vec<Pending>,
) -> Result<Answers, (Answers, String)> {
    let full = group
        .iter()
        .any(|pending| must_sync(pending.batch.events()));
    let begin = if full { BEGIN_FULL } else { BEGIN_NORMAL };
    let conn = &mut writer.conn;
    let mut answers: Answers = Vec::with_capacity(group.len());
    let mut tx = match conn.begin_with(begin).await {
        Ok(tx) => {
            // The `BEGIN` set the connection's sync level, which stays after the transaction.
            writer.full = Some(full);
            tx
        }
        Err(err) => {
            writer.full = None;
            let message = err.to_string();
            answers.extend(group.into_iter().map(|p| (p.answer, Ok(Vec::new()))));
            return Err((answers, message));
        }
    };
    for pending in group {
        answers.push(pending.write(&mut tx, path).await);
    }
    match tx.commit().await {
        Ok(()) => Ok(answers),
        Err(err) => Err((answers, err.to_string())),
    }
}

/// The journal a batch is appended to, and the last seq it must hold for the append to go in.
struct Journal<'a> {
    tenant_id: &'a str,
    session_id: &'a str,
    expected: u64,
}

/// The journal's last seq, read in the transaction (for a conflict's error).
async fn last_seq(conn: &mut SqliteConnection, journal: &Journal<'_>) -> Result<u64, sqlx::Error> {
    let seq: i64 = sqlx::query(
        "SELECT COALESCE(MAX(seq), 0) FROM events WHERE tenant_id = ?1 AND session_id = ?2",
    )
    .bind(journal.tenant_id)
    .bind(journal.session_id)
    .fetch_one(&mut *conn)
    .await?
    .try_get(0)?;
    Ok(u64::try_from(seq).unwrap_or(0))
}

/// Inserts `batch` (its seqs given from the journal's expected last seq), its rows' columns
/// `rows` and its lines `lines`, as few statements as its size allows: `Ok(false)`, with nothing
/// written, when the journal's last seq is not the one expected (a conflict).
///
/// The check is part of the first `INSERT … SELECT … WHERE`, which writes its rows only when the
/// journal's last seq is the expected one, so an append is one statement. Every row of a batch
/// gets the file's next write order (`ingested`), read by the statement itself: one more than
/// the highest in the file for the first statement, the highest (the batch's own) for the next
/// ones. A batch of more than [`ROWS_PER_INSERT`] rows is written under a savepoint, so that it
/// is written whole or not at all.
async fn insert(
    conn: &mut SqliteConnection,
    path: &std::path::Path,
    batch: &[Event],
    rows: Vec<Columns>,
    lines: Vec<Line>,
    journal: &Journal<'_>,
) -> Result<bool, StoreError> {
    let chunked = batch.len() > ROWS_PER_INSERT;
    if chunked {
        sqlx::query("SAVEPOINT loom_batch")
            .execute(&mut *conn)
            .await
            .map_err(|err| db_error(path, err))?;
    }
    let mut rows = rows.into_iter();
    let mut json = lines.into_iter().map(Line::into_string);
    let mut written = Ok(true);
    for (chunk, events) in batch.chunks(ROWS_PER_INSERT).enumerate() {
        let first = chunk == 0;
        let mut arguments = SqliteArguments::default();
        let mut bound = Ok(());
        for event in events {
            let (Some(columns), Some(text)) = (rows.next(), json.next()) else {
                break;
            };
            bound = bind_row(&mut arguments, event, columns, text);
            if bound.is_err() {
                break;
            }
        }
        if first && bound.is_ok() {
            bound = bind_check(&mut arguments, journal);
        }
        if let Err(err) = bound {
            let event = events.first().map_or("?", |event| event.event_id.as_str());
            written = Err(StoreError::Invalid(format!(
                "the batch of event {event} cannot be bound: {err}"
            )));
            break;
        }
        written = sqlx::query_with(
            sqlx::AssertSqlSafe(insert_sql(events.len(), first)),
            arguments,
        )
        .execute(&mut *conn)
        .await
        .map(|done| done.rows_affected() == events.len() as u64)
        .map_err(|err| db_error(path, err));
        if !matches!(written, Ok(true)) {
            break;
        }
    }
    if chunked {
        let end = if matches!(written, Ok(true)) {
            "RELEASE loom_batch"
        } else {
            "ROLLBACK TO loom_batch; RELEASE loom_batch"
        };
        sqlx::query(end)
            .execute(&mut *conn)
            .await
            .map_err(|err| db_error(path, err))?;
    }
    written
}

/// Binds one row's 14 values (all but its write order).
fn bind_row(
    arguments: &mut SqliteArguments,
    event: &Event,
    columns: Columns,
    json: String,
) -> Result<(), sqlx::error::BoxDynError> {
    use sqlx::Arguments;
    arguments.add(event.tenant_id.clone())?;
    arguments.add(event.session_id.clone())?;
    arguments.add(to_sql(event.seq))?;
    arguments.add(event.event_id.clone())?;
    arguments.add(columns.ts)?;
    arguments.add(event.run_id.clone())?;
    arguments.add(event.root_run_id.clone())?;
    arguments.add(event.event_type.clone())?;
    arguments.add(columns.category)?;
    arguments.add(columns.status)?;
    arguments.add(event.agent.clone())?;
    arguments.add(event.role.clone())?;
    arguments.add(columns.facets)?;
    arguments.add(json)?;
    Ok(())
}

/// Binds the seq check's three values (see [`insert_sql`]).
fn bind_check(
    arguments: &mut SqliteArguments,
    journal: &Journal<'_>,
) -> Result<(), sqlx::error::BoxDynError> {
    use sqlx::Arguments;
    arguments.add(journal.tenant_id.to_owned())?;
    arguments.add(journal.session_id.to_owned())?;
    arguments.add(to_sql(journal.expected))?;
    Ok(())
}

/// The `INSERT` of `rows` rows of 14 bound values each, their write order read from the file;
/// the `first` statement of a batch writes them only when the journal's last seq is the
/// expected one (three more bound values: tenant, session, expected seq).
fn insert_sql(rows: usize, first: bool) -> String {
    const ROW: &str = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
    const SELECT: &str = "SELECT column1, column2, column3, column4, column5, column6, column7, \
         column8, column9, column10, column11, column12, column13, column14, ";
    let mut sql =
        String::with_capacity(COLUMNS.len() + SELECT.len() + 300 + rows * (ROW.len() + 2));
    sql.push_str(COLUMNS);
    sql.push_str(SELECT);
    sql.push_str(if first {
        "(SELECT COALESCE(MAX(ingested), 0) + 1 FROM events)"
    } else {
        "(SELECT MAX(ingested) FROM events)"
    });
    sql.push_str(" FROM (VALUES ");
    for i in 0..rows {
        if i > 0 {
            sql.push_str(", ");
        }
        sql.push_str(ROW);
    }
    sql.push(')');
    if first {
        sql.push_str(
            " WHERE (SELECT COALESCE(MAX(seq), 0) FROM events \
             WHERE tenant_id = ? AND session_id = ?) = ?",
        );
    }
    sql
}

/// A group's failure, for one of its batches.
fn failed(path: &std::path::Path, message: &str) -> StoreError {
    StoreError::Io {
        path: path.display().to_string(),
        source: std::io::Error::other(format!("the group commit failed: {message}")),
    }
}

/// The caller's batch was taken by a leader that stopped before answering.
fn interrupted(path: &std::path::Path) -> StoreError {
    StoreError::Io {
        path: path.display().to_string(),
        source: std::io::Error::other(
            "the append was interrupted before its commit was confirmed; read the journal to \
             know whether it was written",
        ),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use loom_core::ports::EventStore;
    use loom_testkit::conformance::{event, events, seqs};

    use crate::SqliteStore;

    impl super::Writer {
        /// Groups committed so far.
        fn groups(&self) -> u64 {
            self.groups.load(std::sync::atomic::Ordering::Relaxed)
        }
    }

    /// Appends of many sessions at once share transactions, each batch gets its own journal's
    /// seqs, and every one reads back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_appends_share_group_commits() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("loom.db")).unwrap();
        const SESSIONS: usize = 64;
        let tasks: Vec<_> = (0..SESSIONS)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    let session = format!("s{i}");
                    let first = store.append(events("t", &session, 2), 0).await.unwrap();
                    let second = store.append(events("t", &session, 3), 2).await.unwrap();
                    (seqs(&first), seqs(&second))
                })
            })
            .collect();
        for task in tasks {
            assert_eq!(task.await.unwrap(), (vec![1, 2], vec![3, 4, 5]));
        }
        for i in 0..SESSIONS {
            let read = store.read("t", &format!("s{i}"), 0).await.unwrap();
            assert_eq!(seqs(&read), vec![1, 2, 3, 4, 5]);
        }
        let groups = store.writer().groups();
        assert!(
            groups < 2 * SESSIONS as u64,
            "{groups} commits for {} appends",
            2 * SESSIONS
        );
    }

    /// A conflicting batch is refused alone: the others of its group commit, and the journal
    /// holds the winner only.
    #[tokio::test]
    async fn a_conflict_in_a_group_refuses_that_batch_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("loom.db")).unwrap();
        // Three appends polled together on one thread: the first leads, the others queue
        // behind it and are written in the next group, together.
        let (a, b, c) = tokio::join!(
            store.append(vec![event("t", "x", "first")], 0),
            store.append(vec![event("t", "x", "rival")], 0),
            store.append(vec![event("t", "y", "other")], 0),
        );
        let outcomes = [a.is_ok(), b.is_ok(), c.is_ok()];
        assert_eq!(outcomes.iter().filter(|ok| **ok).count(), 2, "{outcomes:?}");
        assert!(c.is_ok());
        let lost = if a.is_ok() { b } else { a };
        assert!(
            matches!(
                lost,
                Err(loom_core::ports::StoreError::Conflict {
                    expected: 0,
                    found: 1,
                    ..
                })
            ),
            "{lost:?}"
        );
        assert_eq!(store.read("t", "x", 0).await.unwrap().len(), 1);
        assert_eq!(store.read("t", "y", 0).await.unwrap().len(), 1);
    }

    /// An append alone sets the writer's sync level only when it changes, and a conflict there
    /// writes nothing and says what the journal holds.
    #[tokio::test]
    async fn an_append_alone_sets_its_sync_level_and_refuses_a_conflict() {
        use loom_testkit::conformance::started;
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("loom.db")).unwrap();
        let level = || async {
            let mut slot = store.writer().conn.lock().await;
            let writer = slot.as_mut().unwrap();
            let row = sqlx::query("PRAGMA synchronous")
                .fetch_one(&mut writer.conn)
                .await
                .unwrap();
            (writer.full, sqlx::Row::get::<i64, _>(&row, 0))
        };
        store
            .append(vec![event("t", "s", "claim")], 0)
            .await
            .unwrap();
        assert_eq!(level().await, (Some(false), 1));
        let run = started("t", "s", "s", Default::default());
        store.append(vec![run], 1).await.unwrap();
        assert_eq!(level().await, (Some(true), 2));
        store
            .append(vec![event("t", "s", "again")], 2)
            .await
            .unwrap();
        assert_eq!(level().await, (Some(false), 1));
        let lost = store.append(vec![event("t", "s", "late")], 1).await;
        assert!(
            matches!(
                lost,
                Err(loom_core::ports::StoreError::Conflict {
                    expected: 1,
                    found: 3,
                    ..
                })
            ),
            "{lost:?}"
        );
        assert_eq!(seqs(&store.read("t", "s", 0).await.unwrap()), vec![1, 2, 3]);
        assert_eq!(store.writer().groups(), 4);
    }

    /// A batch larger than one statement holds is written whole, with contiguous seqs.
    #[tokio::test]
    async fn a_batch_over_one_statement_is_written_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("loom.db")).unwrap();
        let n = super::ROWS_PER_INSERT * 2 + 7;
        let written = store.append(events("t", "big", n), 0).await.unwrap();
        assert_eq!(seqs(&written), (1..=n as u64).collect::<Vec<_>>());
        let read = store.read("t", "big", 0).await.unwrap();
        assert_eq!(seqs(&read), (1..=n as u64).collect::<Vec<_>>());
    }
}

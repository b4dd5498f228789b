//! The event bus on PostgreSQL `LISTEN/NOTIFY` ([`PgBus`]): each signal is sent as its JSON
//! with `pg_notify('loom_events', …)` through the database's pool, and each subscription
//! `LISTEN`s on a connection of its own (a pool of one, apart from the statements' pool).
//!
//! Any role may `LISTEN` and `NOTIFY` (PostgreSQL grants no privilege for them, and
//! `pg_notify` is executable by `PUBLIC`), so the application role the pool switches to needs
//! nothing more. A notification is delivered when its transaction commits, to the sessions
//! listening at that moment, on the same database only: nothing is kept for a listener whose
//! connection is down. When the listening connection is lost the stream ends after an error
//! item (sqlx's `PgListener` would reconnect silently, losing what was sent meanwhile; here
//! the subscriber is told, subscribes again and reads the journal to catch up, as the port
//! says).

use loom_core::{
    BoxFuture,
    bus::{BusError, EventBus, Signal, Signals},
};
use sqlx::postgres::PgListener;

use crate::PgDatabase;

/// The channel signals travel on.
pub const CHANNEL: &str = "loom_events";

/// The largest payload `NOTIFY` takes (PostgreSQL's limit is 8000 bytes by default).
pub const MAX_PAYLOAD: usize = 8000;

/// An [`EventBus`] on PostgreSQL `LISTEN/NOTIFY`, shared by every process that reaches the same
/// database. Connects lazily: building it reaches nothing.
#[derive(Debug, Clone)]
pub struct PgBus {
    db: PgDatabase,
}

impl PgBus {
    /// A bus on `db`: notifications go through its pool; each subscription opens its own
    /// connection, as the same user and role.
    pub fn new(db: PgDatabase) -> PgBus {
        PgBus { db }
    }
}

/// A database failure as a [`BusError`], by kind.
fn bus_error(db: &PgDatabase, error: sqlx::Error) -> BusError {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_) => BusError::Unavailable(format!("{}: {error}", db.name())),
        other => BusError::Refused(format!("{}: {other}", db.name())),
    }
}

impl EventBus for PgBus {
    fn publish<'a>(&'a self, signal: &'a Signal) -> BoxFuture<'a, Result<(), BusError>> {
        Box::pin(async move {
            let payload = serde_json::to_string(signal)
                .map_err(|error| BusError::Refused(format!("a signal as JSON: {error}")))?;
            if payload.len() > MAX_PAYLOAD {
                return Err(BusError::Refused(format!(
                    "a signal of {} bytes for session {}: NOTIFY takes at most {MAX_PAYLOAD}",
                    payload.len(),
                    signal.session_id()
                )));
            }
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(CHANNEL)
                .bind(payload)
                .execute(self.db.pool())
                .await
                .map(|_| ())
                .map_err(|error| bus_error(&self.db, error))
        })
    }

    fn subscribe(&self) -> BoxFuture<'_, Result<Signals, BusError>> {
        Box::pin(async move {
            let pool = self.db.single_pool();
            let mut listener = PgListener::connect_with(&pool)
                .await
                .map_err(|error| bus_error(&self.db, error))?;
            // A lost connection ends the stream: no silent reconnection that loses signals.
            listener.eager_reconnect(false);
            listener
                .listen(CHANNEL)
                .await
                .map_err(|error| bus_error(&self.db, error))?;
            let db = self.db.clone();
            let signals: Signals = Box::pin(futures_util::stream::unfold(
                Some(listener),
                move |listener| {
                    let db = db.clone();
                    async move { next(&db, listener?).await }
                },
            ));
            Ok(signals)
        })
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), BusError>> {
        Box::pin(async move {
            sqlx::query("SELECT 1")
                .execute(self.db.pool())
                .await
                .map(|_| ())
                .map_err(|error| bus_error(&self.db, error))
        })
    }
}

/// The next readable signal of `listener`, or the error that ends the stream.
async fn next(
    db: &PgDatabase,
    mut listener: PgListener,
) -> Option<(Result<Signal, BusError>, Option<PgListener>)> {
    loop {
        match listener.try_recv().await {
            Ok(Some(notification)) => {
                match serde_json::from_str::<Signal>(notification.payload()) {
                    Ok(signal) => return Some((Ok(signal), Some(listener))),
                    Err(error) => tracing::warn!(
                        database = %db.name(),
                        channel = CHANNEL,
                        %error,
                        "an unreadable notification on the event bus was skipped"
                    ),
                }
            }
            Ok(None) => {
                let lost =
                    BusError::Unavailable(format!("{}: the LISTEN connection was lost", db.name()));
                return Some((Err(lost), None));
            }
            Err(error) => return Some((Err(bus_error(db, error)), None)),
        }
    }
}

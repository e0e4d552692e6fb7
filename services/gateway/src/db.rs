//! Reading the read models from request handlers: a few pooled SQLite connections, used on
//! Tokio's blocking threads so a slow query never stalls the server's reactor.

use std::path::PathBuf;
use std::sync::Mutex;

use allot_store::rusqlite::{Connection, OpenFlags};

/// A pool of read-only connections to `gateway.db`.
#[derive(Debug)]
pub struct Db {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

/// At most this many idle connections are kept.
const KEEP: usize = 8;

impl Db {
    /// Connections to the database at `path` (it must exist: the service creates it).
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            idle: Mutex::new(Vec::new()),
        }
    }

    fn open(&self) -> allot_store::rusqlite::Result<Connection> {
        let conn = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        Ok(conn)
    }

    /// Runs `f` with a connection, on a blocking thread.
    pub async fn read<T, F>(self: &std::sync::Arc<Self>, f: F) -> Result<T, String>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> allot_store::rusqlite::Result<T> + Send + 'static,
    {
        let db = self.clone();
        tokio::task::spawn_blocking(move || {
            let conn = match db.idle.lock().expect("db pool").pop() {
                Some(c) => c,
                None => db
                    .open()
                    .map_err(|e| format!("opening the read model: {e}"))?,
            };
            let out = f(&conn).map_err(|e| format!("reading the read model: {e}"));
            let mut idle = db.idle.lock().expect("db pool");
            if idle.len() < KEEP {
                idle.push(conn);
            }
            out
        })
        .await
        .map_err(|e| format!("reading the read model: {e}"))?
    }
}

//! How every Allot service runs: one [`Service`] per process part (inventory, planner, …).
//!
//! A service connects, then spawns its long-running parts — consumers, relays, reporters,
//! endpoints — as **named tasks**, each inside a `task` span that carries the service's and
//! the task's names, so every log line says where it came from. Then [`Service::run`] waits:
//!
//! - **The first task to fail stops the rest.** Its error (or panic) is what `run` returns,
//!   with the task's name, so the process exits non-zero and an orchestrator restarts it; a
//!   service never limps on with one consumer dead.
//! - **Stopping** — the caller's shutdown future completing, or a failure — cancels one
//!   [`Stopping`] signal that every task watches. What is still running then gets one grace
//!   period ([`GRACE`] unless [`Service::with_grace`]) to finish its batch and return; what
//!   overruns it is aborted and named in the log. The NATS connection is drained in what is
//!   left of the same period, so publishes already handed to the client reach the server.
//!
//! Handler errors have kinds on the bus side (`allot_bus::consumer::HandlerError`): *rejected*
//! messages are dead-lettered, *transient* errors are retried in place, only *fatal* ones end a
//! consumer — and so, through this crate, the service.
//!
//! Learned from linkerd2-proxy's and mini-redis's shape: one shutdown signal fanned out to
//! every task, and a join that treats the first error as the service's.
//!
//! # Layout
//!
//! - This file: [`Service`], the named tasks, the first failure, the grace period.
//! - [`ready`]: whether each service of the process is starting, ready or stopping — a
//!   service is ready once it runs and every [`Gate`] it handed out (one per consumer) is open.
//! - [`metrics`]: the process-wide Prometheus registry every crate registers its `allot_*`
//!   families in, and [`metrics::encode`].
//! - [`files`]: files other processes read while this one writes them (written whole).
//! - [`ops`]: the ops HTTP endpoints — `/metrics`, `/healthz`, `/readyz` — that `allot run`
//!   serves on its ops address.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use tokio::task::{Id, JoinError, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub mod files;
pub mod metrics;
pub mod ops;
pub mod ready;

use ready::Status;
pub use ready::{Gate, Readiness, State};

/// How long a stopping service's tasks and NATS drain get, together, by default.
pub const GRACE: Duration = Duration::from_secs(10);

/// Completes once the service is stopping; clone it into every task (it is cheap).
pub type Stopping = Shared<BoxFuture<'static, ()>>;

/// Why a service stopped on its own.
#[derive(Debug)]
pub enum Stopped<E> {
    /// A task returned an error.
    Failed {
        /// The task's name.
        task: String,
        /// What it returned.
        error: E,
    },
    /// A task panicked.
    Panicked {
        /// The task's name.
        task: String,
        /// The panic's message, when it had one.
        message: String,
    },
}

impl<E> Stopped<E> {
    /// The name of the task that stopped the service.
    pub fn task(&self) -> &str {
        match self {
            Self::Failed { task, .. } | Self::Panicked { task, .. } => task,
        }
    }
}

impl<E: fmt::Display> fmt::Display for Stopped<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Failed { task, error } => write!(f, "{task}: {error}"),
            Self::Panicked { task, message } => write!(f, "{task} panicked: {message}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for Stopped<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Failed { error, .. } => Some(error),
            Self::Panicked { .. } => None,
        }
    }
}

/// A running service: its named tasks, its stop signal and, once connected, its NATS client.
pub struct Service<E> {
    name: &'static str,
    token: CancellationToken,
    tasks: JoinSet<Result<(), E>>,
    names: HashMap<Id, String>,
    grace: Duration,
    client: Option<async_nats::Client>,
    status: Arc<Status>,
}

impl<E> fmt::Debug for Service<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut running: Vec<&str> = self.names.values().map(String::as_str).collect();
        running.sort_unstable();
        f.debug_struct("Service")
            .field("name", &self.name)
            .field("tasks", &running)
            .field("state", &self.status.state())
            .finish_non_exhaustive()
    }
}

impl<E: fmt::Display + Send + 'static> Service<E> {
    /// The service `name`, stopping when `shutdown` completes, reporting its readiness to
    /// the process's [`Readiness`]. Call from within a Tokio runtime.
    pub fn new(name: &'static str, shutdown: impl Future<Output = ()> + Send + 'static) -> Self {
        Self::reporting_to(Readiness::process(), name, shutdown)
    }

    /// [`Service::new`], reporting its readiness to `readiness` instead.
    pub fn reporting_to(
        readiness: &Readiness,
        name: &'static str,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        let token = CancellationToken::new();
        let status = Status::new(name, token.clone());
        readiness.add(&status);
        let watcher = token.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = shutdown => watcher.cancel(),
                () = watcher.cancelled() => {}
            }
        });
        Self {
            name,
            token,
            tasks: JoinSet::new(),
            names: HashMap::new(),
            grace: GRACE,
            client: None,
            status,
        }
    }

    /// Gives stopping tasks and the NATS drain `grace` instead of [`GRACE`].
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The service's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Completes once the service is stopping.
    pub fn stopping(&self) -> Stopping {
        let token = self.token.clone();
        async move { token.cancelled().await }.boxed().shared()
    }

    /// Where the service stands: starting, ready or stopping (see [`ready`]).
    pub fn state(&self) -> State {
        self.status.state()
    }

    /// A start-up step the service is not ready without, named by `what` (`/readyz` lists
    /// those still closed): open the gate once the step is done — a consumer, once its
    /// durable consumer exists.
    pub fn gate(&self, what: impl Into<String>) -> Gate {
        self.status.gate(what.into())
    }

    /// Drains `client` when the service stops (after its tasks, within the grace period).
    pub fn drain_on_stop(&mut self, client: async_nats::Client) {
        self.client = Some(client);
    }

    /// Runs `task` as the task `name`, inside a span naming the service and the task.
    pub fn spawn(
        &mut self,
        name: impl Into<String>,
        task: impl Future<Output = Result<(), E>> + Send + 'static,
    ) {
        let name = name.into();
        let span = tracing::info_span!("task", service = self.name, task = %name);
        let handle = self.tasks.spawn(task.instrument(span));
        self.names.insert(handle.id(), name);
    }

    /// Waits until every task has ended, or until one fails or the shutdown future completes;
    /// then stops the rest within the grace period and drains the client. `Ok` when the service
    /// was asked to stop (or every task ended well), else what stopped it.
    pub async fn run(mut self) -> Result<(), Stopped<E>> {
        self.status.running();
        let mut first: Option<Stopped<E>> = None;
        loop {
            let next = tokio::select! {
                biased;
                next = self.tasks.join_next_with_id() => next,
                () = self.token.cancelled() => break,
            };
            let Some(next) = next else {
                break;
            };
            if let Some(failure) = self.ended(next) {
                first = Some(failure);
                break;
            }
        }
        self.token.cancel();
        let deadline = Instant::now() + self.grace;
        loop {
            match tokio::time::timeout_at(deadline, self.tasks.join_next_with_id()).await {
                Ok(Some(next)) => {
                    if let Some(failure) = self.ended(next) {
                        first.get_or_insert(failure);
                    }
                }
                Ok(None) => break,
                Err(_) => {
                    tracing::warn!(
                        service = self.name,
                        grace = ?self.grace,
                        tasks = %self.running(),
                        "tasks did not stop within the grace period; aborting them"
                    );
                    self.tasks.abort_all();
                    while self.tasks.join_next().await.is_some() {}
                    break;
                }
            }
        }
        if let Some(client) = self.client.take() {
            // At least a moment, even when the tasks used up the grace period.
            let until = deadline.max(Instant::now() + Duration::from_millis(500));
            if tokio::time::timeout_at(until, client.drain())
                .await
                .is_err()
            {
                tracing::warn!(
                    service = self.name,
                    "draining the NATS connection timed out"
                );
            }
        }
        match &first {
            None => tracing::info!(service = self.name, "stopped"),
            Some(why) => tracing::error!(service = self.name, task = why.task(), "stopped: {why}"),
        }
        first.map_or(Ok(()), Err)
    }

    /// Forgets a task that ended; what stops the service if it failed.
    fn ended(&mut self, next: Result<(Id, Result<(), E>), JoinError>) -> Option<Stopped<E>> {
        match next {
            Ok((id, Ok(()))) => {
                let task = self.names.remove(&id).unwrap_or_default();
                tracing::debug!(service = self.name, %task, "task ended");
                None
            }
            Ok((id, Err(error))) => {
                let task = self.names.remove(&id).unwrap_or_default();
                tracing::error!(service = self.name, %task, %error, "task failed; stopping the service");
                Some(Stopped::Failed { task, error })
            }
            Err(e) => {
                let task = self.names.remove(&e.id()).unwrap_or_default();
                if e.is_cancelled() {
                    return None;
                }
                let payload = e.into_panic();
                let message = payload
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                tracing::error!(service = self.name, %task, %message, "task panicked; stopping the service");
                Some(Stopped::Panicked { task, message })
            }
        }
    }

    /// The tasks still running, by name.
    fn running(&self) -> String {
        let mut names: Vec<&str> = self.names.values().map(String::as_str).collect();
        names.sort_unstable();
        names.join(", ")
    }
}

#[cfg(test)]
mod tests;

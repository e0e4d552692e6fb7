//! Whether the process's services are ready: what `/readyz` answers.
//!
//! A [`Service`](crate::Service) is *starting* from its creation until it runs — connected,
//! its tasks spawned ([`Service::run`](crate::Service::run) entered) — and every
//! [`Gate`] it handed out is open (a consumer opens its gate once its durable consumer
//! exists); then *ready*; and *stopping* from the moment it is asked to stop (or a task
//! failed) until it has stopped, when it leaves the list. The process is ready when it runs at
//! least one service and every one of them is ready, so an orchestrator sends no traffic to a
//! pod that is still catching up its consumers or already draining.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use tokio_util::sync::CancellationToken;

/// Where a service stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Connecting, spawning its tasks, or waiting on a gate.
    Starting,
    /// Running with every gate open.
    Ready,
    /// Asked to stop (or a task failed); finishing its work.
    Stopping,
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Starting => "starting",
            Self::Ready => "ready",
            Self::Stopping => "stopping",
        })
    }
}

/// The readiness of one service, shared by the service, its gates and the registry.
#[derive(Debug)]
pub(crate) struct Status {
    name: &'static str,
    stopping: CancellationToken,
    running: AtomicBool,
    /// The gates not yet open, by what they wait for.
    closed: Mutex<Vec<String>>,
}

impl Status {
    pub(crate) fn new(name: &'static str, stopping: CancellationToken) -> Arc<Self> {
        Arc::new(Self {
            name,
            stopping,
            running: AtomicBool::new(false),
            closed: Mutex::new(Vec::new()),
        })
    }

    pub(crate) fn running(&self) {
        self.running.store(true, Ordering::Release);
    }

    pub(crate) fn state(&self) -> State {
        if self.stopping.is_cancelled() {
            State::Stopping
        } else if self.running.load(Ordering::Acquire) && self.waiting_for().is_empty() {
            State::Ready
        } else {
            State::Starting
        }
    }

    fn waiting_for(&self) -> Vec<String> {
        self.closed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn gate(self: &Arc<Self>, what: String) -> Gate {
        self.closed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(what.clone());
        Gate {
            status: Arc::clone(self),
            what,
        }
    }
}

/// A start-up step its service is not ready without (see [`crate::Service::gate`]); open it
/// once the step is done. A gate dropped unopened keeps its service starting.
#[derive(Debug)]
#[must_use = "a gate that is never opened keeps its service from being ready"]
pub struct Gate {
    status: Arc<Status>,
    what: String,
}

impl Gate {
    /// The step is done.
    pub fn open(self) {
        let mut closed = self
            .status
            .closed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(i) = closed.iter().position(|w| *w == self.what) {
            closed.remove(i);
        }
    }
}

/// The services of a process that report their readiness (see [`Readiness::process`]).
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    services: Arc<Mutex<Vec<Weak<Status>>>>,
}

/// One service's name and state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceState {
    /// The service's name.
    pub name: &'static str,
    /// Where it stands.
    pub state: State,
    /// The gates it waits for, if starting.
    pub waiting_for: Vec<String>,
}

impl Readiness {
    /// The process's own: every [`crate::Service::new`] reports here, and `/readyz` reads it.
    pub fn process() -> &'static Readiness {
        static PROCESS: OnceLock<Readiness> = OnceLock::new();
        PROCESS.get_or_init(Readiness::default)
    }

    pub(crate) fn add(&self, status: &Arc<Status>) {
        let mut services = self
            .services
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        services.retain(|s| s.strong_count() > 0);
        services.push(Arc::downgrade(status));
    }

    /// The services running now (those that stopped are gone), in the order they started.
    pub fn services(&self) -> Vec<ServiceState> {
        let services = self
            .services
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        services
            .iter()
            .filter_map(Weak::upgrade)
            .map(|s| ServiceState {
                name: s.name,
                state: s.state(),
                waiting_for: s.waiting_for(),
            })
            .collect()
    }

    /// Whether at least one service runs and every one is ready.
    pub fn ready(&self) -> bool {
        let services = self.services();
        !services.is_empty() && services.iter().all(|s| s.state == State::Ready)
    }
}

//! The circuit breaker: how much of a pool remediation may take out of service within a
//! window. Past it, a node action becomes an alert — many nodes failing at once is more often
//! the monitoring, the network or a bad driver roll-out than the GPUs, and a mass cordon turns
//! a scare into an outage.

use std::collections::VecDeque;

use crate::Millis;

/// Caps the nodes taken out in any window.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Breaker {
    /// The most nodes taken out within `window`.
    pub max_nodes: usize,
    /// The window, ms.
    pub window: Millis,
    taken: VecDeque<Millis>,
}

impl Breaker {
    /// At most `share` of a pool of `pool_nodes` (at least one node) within `window` ms.
    pub fn new(share: f64, pool_nodes: usize, window: Millis) -> Self {
        let max_nodes = ((pool_nodes as f64 * share).floor() as usize).max(1);
        Self {
            max_nodes,
            window,
            taken: VecDeque::new(),
        }
    }

    /// Whether one more node may be taken out at `at` (and counts it if so).
    pub fn admit(&mut self, at: Millis) -> bool {
        if !self.would_admit(at) {
            return false;
        }
        self.taken.push_back(at);
        true
    }

    /// Whether one more node could be taken out at `at` (counts nothing).
    pub fn would_admit(&mut self, at: Millis) -> bool {
        while self
            .taken
            .front()
            .is_some_and(|t| at.saturating_sub(*t) >= self.window)
        {
            self.taken.pop_front();
        }
        self.taken.len() < self.max_nodes
    }

    /// The pool now has `pool_nodes` nodes: the cap follows (what was taken stays counted).
    pub fn resize(&mut self, share: f64, pool_nodes: usize) {
        self.max_nodes = ((pool_nodes as f64 * share).floor() as usize).max(1);
    }
}

//! Remediation's metrics, in the process's registry ([`allot_runtime::metrics`]):
//! `allot_remediation_actions_total{action}`, the actions decided (`alert`, `cordon`,
//! `drain`, … as on the wire), counted when committed to the outbox — each is published
//! from there, once.

use std::sync::LazyLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use allot_events::remediation::ActionTaken;
use allot_runtime::metrics::register;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Action {
    action: &'static str,
}

static ACTIONS: LazyLock<Family<Action, Counter>> = LazyLock::new(|| {
    register(
        "remediation_actions",
        "Actions remediation decided, by action",
        Family::default(),
    )
});

/// Counts `actions`, just committed.
pub(crate) fn decided(actions: &[ActionTaken]) {
    for a in actions {
        ACTIONS
            .get_or_create(&Action {
                action: a.action.as_str(),
            })
            .inc();
    }
}

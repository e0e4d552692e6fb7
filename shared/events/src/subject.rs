//! Subjects (`allot.<domain>.<event>.<key…>`) and validation of the tokens that go into them.
//!
//! A token that contains `.`, `*`, `>` or whitespace would change a subject's meaning (split it,
//! or turn it into a wildcard), so names that become subject tokens are checked where they enter
//! the system: node names, pools and teams.

/// Why a name cannot be used as a subject token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} {value:?} is not a valid name: use 1-64 characters from a-z, A-Z, 0-9, '-' and '_'"
)]
pub struct InvalidToken {
    /// What kind of name it was (`node name`, `team` …).
    pub what: &'static str,
    /// The rejected value.
    pub value: String,
}

/// Checks that `value` can be used as one subject token.
pub fn validate_token(what: &'static str, value: &str) -> Result<(), InvalidToken> {
    let ok = !value.is_empty()
        && value.len() <= 64
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(InvalidToken {
            what,
            value: value.to_owned(),
        })
    }
}

/// Every node event: `allot.node.>`.
pub const NODE_ALL: &str = "allot.node.>";
/// Every telemetry sample: `allot.telemetry.>`.
pub const TELEMETRY_ALL: &str = "allot.telemetry.>";
/// Every inventory state change: `allot.inventory.>`.
pub const INVENTORY_ALL: &str = "allot.inventory.>";
/// Every workload event (submitted, aborted, finished): `allot.workload.>`.
pub const WORKLOAD_ALL: &str = "allot.workload.>";
/// Every task lifecycle event (ready, preload, started, checkpointed, completed, failed,
/// cancelled, stopped): `allot.task.>`.
pub const TASK_ALL: &str = "allot.task.>";
/// Every allocator journal entry and decision: `allot.alloc.>`.
pub const ALLOC_ALL: &str = "allot.alloc.>";
/// Every remediation action and operator cordon: `allot.remediation.>`.
pub const REMEDIATION_ALL: &str = "allot.remediation.>";
/// Every cost event, of every team: `allot.cost.>`.
pub const COST_ALL: &str = "allot.cost.>";
/// Dead letters: `allot.deadletter.<original subject>`.
pub const DEAD_LETTER_PREFIX: &str = "allot.deadletter";
/// Inventory's request/reply query endpoint (core NATS, not a stream).
pub const INVENTORY_QUERY: &str = "allot.query.inventory";
/// The planner's request/reply query endpoints (core NATS, not a stream).
pub const PLANNER_QUERY: &str = "allot.query.planner";

/// Every token event: `allot.access.>`.
pub const ACCESS_ALL: &str = "allot.access.>";

/// `allot.access.<event>.<team>`
pub fn access(event: &str, team: &str) -> String {
    format!("allot.access.{event}.{team}")
}

/// `allot.remediation.<event>.<node>`
pub fn remediation(event: &str, node: &str) -> String {
    format!("allot.remediation.{event}.{node}")
}

/// `allot.node.registered.<node>`
pub fn node_registered(node: &str) -> String {
    format!("allot.node.registered.{node}")
}

/// `allot.node.heartbeat.<node>`
pub fn node_heartbeat(node: &str) -> String {
    format!("allot.node.heartbeat.{node}")
}

/// `allot.telemetry.<node>`
pub fn telemetry(node: &str) -> String {
    format!("allot.telemetry.{node}")
}

/// `allot.inventory.<event>.<node>`
pub fn inventory(event: &str, node: &str) -> String {
    format!("allot.inventory.{event}.{node}")
}

/// `allot.workload.submitted.<team>`
pub fn workload_submitted(team: &str) -> String {
    format!("allot.workload.submitted.{team}")
}

/// `allot.workload.aborted.<team>`
pub fn workload_aborted(team: &str) -> String {
    format!("allot.workload.aborted.{team}")
}

/// `allot.workload.finished.<team>`
pub fn workload_finished(team: &str) -> String {
    format!("allot.workload.finished.{team}")
}

/// `allot.workload.abort_answered.<team>`: the planner's answers to the team's aborts.
pub fn workload_abort_answered(team: &str) -> String {
    format!("allot.workload.abort_answered.{team}")
}

/// `allot.task.<event>.<pool>`: a task event the planner publishes (ready, preload, cancelled).
pub fn task(event: &str, pool: &str) -> String {
    format!("allot.task.{event}.{pool}")
}

/// `allot.task.<event>.<pool>.<node>`: a task event the collector of `node` publishes about a
/// run on it (started, checkpointed, completed, failed, stopped). The node is in the subject so
/// that the server can let each collector speak for its own node only.
pub fn task_on_node(event: &str, pool: &str, node: &str) -> String {
    format!("allot.task.{event}.{pool}.{node}")
}

/// Every task event of `pool`, from the planner and from every node:
/// `allot.task.*.<pool>` and `allot.task.*.<pool>.*` (a consumer's filter subjects).
pub fn task_of_pool(pool: &str) -> Vec<String> {
    vec![
        format!("allot.task.*.{pool}"),
        format!("allot.task.*.{pool}.*"),
    ]
}

/// `allot.alloc.<pool>.journal`: the allocator's journal of a pool.
pub fn alloc_journal(pool: &str) -> String {
    format!("allot.alloc.{pool}.journal")
}

/// `allot.cost.<team>.<workload>`: what one workload of a team cost (published by billing).
pub fn cost(team: &str, workload: &str) -> String {
    format!("allot.cost.{team}.{workload}")
}

/// `allot.cost.<team>.>`: every cost event of one team, and nothing of another's.
pub fn cost_of_team(team: &str) -> String {
    format!("allot.cost.{team}.>")
}

/// `allot.deadletter.<original subject>`
pub fn dead_letter(original: &str) -> String {
    format!("{DEAD_LETTER_PREFIX}.{original}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_that_would_split_or_widen_a_subject_are_rejected() {
        for (value, want_ok) in [
            ("node-1", true),
            ("gpu_pool_A", true),
            ("", false),
            ("node.1", false),
            ("node*", false),
            ("node>", false),
            ("node 1", false),
            (&"x".repeat(65), false),
        ] {
            assert_eq!(
                validate_token("node name", value).is_ok(),
                want_ok,
                "{value:?}"
            );
        }
    }
}

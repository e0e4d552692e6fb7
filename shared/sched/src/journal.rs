//! The journal: every input the scheduler applied, in order, with the decisions it made — what
//! the allocator appends to the DECISIONS stream and what an audit replays.
//!
//! Because the scheduler is a pure function of its inputs, [`verify`] can rebuild its state
//! from a journal and recompute every decision; the first entry whose recomputed outcome
//! differs from the logged one is returned as a [`Mismatch`], with both outcomes. It also
//! checks every logged entry against the [`invariants`] (no GPU held twice, no task granted
//! twice, every lease ended once), which a faithful recomputation alone cannot prove.

pub mod invariants;

use crate::decision::Decision;
use crate::model::Time;
use crate::policy::{self, Policy};
use crate::scheduler::{Input, RunEnd, Scheduler};

use self::invariants::{Checker, Violation};

/// One applied input and its outcome.
#[derive(
    Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct Entry {
    /// Position in the journal, from 1, without gaps.
    pub seq: u64,
    /// The input.
    pub input: Input,
    /// The decisions it produced (empty if it was rejected).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<Decision>,
    /// Why the scheduler rejected it, if it did (the state did not change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected: Option<String>,
}

/// What a journal starts with: which policy produced it, so a replay runs the same one.
#[derive(
    Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct Header {
    /// Journal format: `allot-journal/v1`.
    pub journal: String,
    /// The policy's name ([`policy::by_name`]).
    pub policy: String,
}

/// The journal format this crate writes and reads.
pub const FORMAT: &str = "allot-journal/v1";

impl Header {
    /// The header of a journal written under `policy`.
    pub fn new(policy: &str) -> Self {
        Self {
            journal: FORMAT.into(),
            policy: policy.into(),
        }
    }
}

impl Input {
    /// When it happened, for inputs that carry a time.
    pub fn at(&self) -> Option<Time> {
        match self {
            Self::TaskSubmitted { at, .. }
            | Self::TaskFinished { at, .. }
            | Self::TaskCheckpointed { at, .. }
            | Self::TaskRequeued { at, .. }
            | Self::TaskPreloaded { at, .. }
            | Self::TaskWithdrawn { at, .. }
            | Self::TaskPredicted { at, .. }
            | Self::NodeHeld { at, .. }
            | Self::GpuService { at, .. }
            | Self::Schedule { at } => Some(*at),
            Self::NodeAdded(_)
            | Self::NodeSchedulable { .. }
            | Self::TeamQuota { .. }
            | Self::TeamBudget { .. } => None,
        }
    }
}

/// Applies `input` and returns it as the journal entry `seq`.
pub fn apply(scheduler: &mut Scheduler, seq: u64, input: Input) -> Entry {
    apply_typed(scheduler, seq, input).0
}

/// [`apply`], also returning the typed error when the input was rejected.
pub fn apply_typed(
    scheduler: &mut Scheduler,
    seq: u64,
    input: Input,
) -> (Entry, Option<crate::ApplyError>) {
    let mut decisions = Vec::new();
    let error = scheduler.apply_into(input.clone(), &mut decisions).err();
    let entry = Entry {
        seq,
        input,
        decisions,
        rejected: error.as_ref().map(ToString::to_string),
    };
    (entry, error)
}

/// What a verified replay covered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Summary {
    /// Entries applied (the state was rebuilt from all of them).
    pub entries: u64,
    /// Entries whose outcome was compared (those in the time window).
    pub verified: u64,
    /// Decisions compared.
    pub decisions: u64,
}

/// The first entry whose recomputed outcome differs from the logged one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The entry as logged.
    pub logged: Entry,
    /// The same input's outcome, recomputed.
    pub recomputed: Entry,
}

/// A logged entry that breaks an invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken {
    /// What it breaks.
    pub violation: Violation,
    /// The entry as logged.
    pub logged: Entry,
    /// Its recomputed outcome, when that differs from the logged one too. `None`: the
    /// scheduler itself decides so — a scheduler bug, not a journal edited or written by
    /// other code.
    pub recomputed: Option<Entry>,
}

/// Why a journal cannot be verified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// The header names a format this crate does not read.
    #[error("unsupported journal format {0:?} (expected {FORMAT})")]
    Format(String),
    /// The header names a policy this build does not have.
    #[error("the journal was written by policy {0:?}, which this build does not know")]
    UnknownPolicy(String),
    /// Entries are missing or out of order.
    #[error("entry {found} follows entry {previous}: the journal has a gap or is out of order")]
    Sequence {
        /// The previous entry's sequence.
        previous: u64,
        /// The sequence found.
        found: u64,
    },
    /// An outcome differs.
    #[error("entry {} ({}): logged and recomputed outcomes differ", .0.logged.seq, describe(&.0.logged.input))]
    Mismatch(Box<Mismatch>),
    /// A logged entry breaks an invariant (reported before any difference in the same entry).
    #[error("entry {} ({}): invariant broken: {}", .0.logged.seq, describe(&.0.logged.input), .0.violation.broken)]
    Invariant(Box<Broken>),
}

/// A one-line description of an input, for messages.
pub fn describe(input: &Input) -> String {
    match input {
        Input::NodeAdded(n) => format!("node {} added", n.name),
        Input::NodeSchedulable { node, schedulable } => {
            format!("node {node} schedulable={schedulable}")
        }
        Input::NodeHeld {
            node,
            by,
            held,
            drain,
            at,
            ..
        } => format!(
            "node {node} {} by {by:?}{} at {at}",
            if *held { "held" } else { "released" },
            if *drain { " and drained" } else { "" }
        ),
        Input::GpuService {
            node,
            gpu,
            in_service,
            at,
            ..
        } => format!(
            "GPU {gpu} of node {node} {} at {at}",
            if *in_service {
                "back in service"
            } else {
                "out of service"
            }
        ),
        Input::TeamQuota { team, .. } => format!("quota of team {team} set"),
        Input::TeamBudget { team, exceeded, .. } => {
            format!("team {team} budget exceeded={exceeded}")
        }
        Input::TaskSubmitted { task, at } => format!("{} submitted at {at}", task.id),
        Input::TaskFinished { task, at, run } => match run {
            Some(run) => format!("{task} finished at {at} ({})", run_end(run)),
            None => format!("{task} finished at {at}"),
        },
        Input::TaskCheckpointed { task, at } => format!("{task} checkpointed at {at}"),
        Input::TaskRequeued { task, at, .. } => format!("{task} requeued at {at}"),
        Input::TaskWithdrawn { task, at, run, .. } => match run {
            Some(run) => format!(
                "{task} withdrawn at {at} (its stopped run {})",
                run_end(run)
            ),
            None => format!("{task} withdrawn at {at}"),
        },
        Input::TaskPredicted { task, duration, at } => {
            format!("{task} predicted to run {duration} ms, at {at}")
        }
        Input::TaskPreloaded {
            task,
            expected_at,
            at,
        } => format!("{} preloaded at {at}, expected at {expected_at}", task.id),
        Input::Schedule { at } => format!("pass at {at}"),
    }
}

/// A run's end in words: `lease 7 completed`, `lease 7 failed: exit code 1`.
pub fn run_end(run: &RunEnd) -> String {
    let how = format!("lease {} {}", run.lease().0, run.outcome());
    match run {
        RunEnd::Completed { .. } => how,
        RunEnd::Failed { reason, .. } => format!("{how}: {reason}"),
    }
}

/// Rebuilds the scheduler from `entries` (in journal order, from the first) and recomputes
/// every outcome; compares those of entries timed within `[from, to]` (untimed entries are
/// always compared) and stops after `to`.
///
/// Every entry applied, inside the window or before it, is first checked against the
/// [`invariants`] as logged: the logged decisions are what the cluster acted on, so a GPU they
/// hand out twice was handed out twice whatever the recomputation says, and the violation
/// names the task, lease and GPU where a mismatch would only show two outcomes.
pub fn verify<I>(
    header: &Header,
    entries: I,
    from: Option<Time>,
    to: Option<Time>,
) -> Result<Summary, VerifyError>
where
    I: IntoIterator<Item = Entry>,
{
    if header.journal != FORMAT {
        return Err(VerifyError::Format(header.journal.clone()));
    }
    let policy: Box<dyn Policy> = policy::by_name(&header.policy)
        .ok_or_else(|| VerifyError::UnknownPolicy(header.policy.clone()))?;
    let mut scheduler = Scheduler::new(policy);
    let mut checker = Checker::new();
    let mut summary = Summary::default();
    let mut previous = 0;
    // One buffer for every entry's recomputed decisions; the recomputed entry is built only to
    // report a difference.
    let mut decisions = Vec::new();
    for logged in entries {
        if logged.seq != previous + 1 {
            return Err(VerifyError::Sequence {
                previous,
                found: logged.seq,
            });
        }
        previous = logged.seq;
        let at = logged.input.at();
        if let (Some(at), Some(to)) = (at, to)
            && at > to
        {
            break;
        }
        decisions.clear();
        let rejected = scheduler
            .apply_into(logged.input.clone(), &mut decisions)
            .err()
            .map(|e| e.to_string());
        let same = decisions == logged.decisions && rejected == logged.rejected;
        let recomputed = |logged: &Entry| Entry {
            seq: logged.seq,
            input: logged.input.clone(),
            decisions: decisions.clone(),
            rejected: rejected.clone(),
        };
        if let Err(violation) = checker.check(&logged) {
            let recomputed = (!same).then(|| recomputed(&logged));
            return Err(VerifyError::Invariant(Box::new(Broken {
                violation,
                logged,
                recomputed,
            })));
        }
        summary.entries += 1;
        let compare = match (at, from) {
            (Some(at), Some(from)) => at >= from,
            _ => true,
        };
        if !compare {
            continue;
        }
        if !same {
            return Err(VerifyError::Mismatch(Box::new(Mismatch {
                recomputed: recomputed(&logged),
                logged,
            })));
        }
        summary.verified += 1;
        summary.decisions += decisions.len() as u64;
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{LeaseId, NodeSpec, TaskId, TaskSpec};

    fn journal() -> Vec<Entry> {
        let mut s = Scheduler::new(policy::by_name("allot").unwrap());
        let inputs = vec![
            Input::NodeAdded(NodeSpec::new("n1", 8, "H100")),
            Input::TaskSubmitted {
                task: TaskSpec::new(1, "a", 8),
                at: 0,
            },
            Input::Schedule { at: 0 },
            Input::TaskSubmitted {
                task: TaskSpec::new(2, "a", 4),
                at: 10,
            },
            Input::Schedule { at: 10 },
            Input::TaskFinished {
                task: TaskId(9),
                at: 20,
                run: None,
            },
            Input::TaskFinished {
                task: TaskId(1),
                at: 30,
                run: Some(RunEnd::Completed { lease: LeaseId(1) }),
            },
            Input::Schedule { at: 30 },
        ];
        inputs
            .into_iter()
            .enumerate()
            .map(|(i, input)| apply(&mut s, i as u64 + 1, input))
            .collect()
    }

    #[test]
    fn a_faithful_journal_verifies_and_survives_a_json_round_trip() {
        let entries = journal();
        assert!(entries[5].rejected.is_some(), "task 9 never ran");
        let text: Vec<String> = entries
            .iter()
            .map(|e| serde_json::to_string(e).unwrap())
            .collect();
        let back: Vec<Entry> = text
            .iter()
            .map(|t| serde_json::from_str(t).unwrap())
            .collect();
        let summary = verify(&Header::new("allot"), back, None, None).unwrap();
        assert_eq!(summary.entries, 8);
        assert_eq!(summary.verified, 8);
        assert!(summary.decisions >= 3);
    }

    #[test]
    fn the_first_difference_is_named() {
        struct Case {
            name: &'static str,
            tamper: fn(&mut Vec<Entry>),
            want: &'static str,
        }
        let cases = [
            Case {
                name: "a grant moved to another lease",
                tamper: |e| {
                    if let Decision::Granted { lease, .. } = &mut e[2].decisions[0] {
                        lease.0 += 1;
                    }
                },
                want: "entry 3 (pass at 0)",
            },
            Case {
                name: "a decision dropped",
                tamper: |e| e[7].decisions.clear(),
                want: "entry 8 (pass at 30)",
            },
            Case {
                name: "an entry dropped",
                tamper: |e| {
                    e.remove(3);
                },
                want: "entry 5 follows entry 3",
            },
            Case {
                name: "a rejection hidden",
                tamper: |e| e[5].rejected = None,
                want: "entry 6 (task-9 finished at 20)",
            },
        ];
        for case in cases {
            let mut entries = journal();
            (case.tamper)(&mut entries);
            let err = verify(&Header::new("allot"), entries, None, None).unwrap_err();
            assert!(err.to_string().contains(case.want), "{}: {err}", case.name);
        }
    }

    #[test]
    fn a_logged_double_grant_is_named_as_such_before_the_difference() {
        let mut entries = journal();
        let grant = entries[2].decisions[0].clone();
        entries[4].decisions.push(grant);
        let err = verify(&Header::new("allot"), entries, None, None).unwrap_err();
        assert!(
            err.to_string().contains(
                "entry 5 (pass at 10): invariant broken: task-1 granted twice: lease 1 while it \
                 still holds lease 1 (granted at entry 3"
            ),
            "{err}"
        );
        let VerifyError::Invariant(broken) = err else {
            panic!("{err}")
        };
        assert!(
            broken.recomputed.is_some(),
            "the scheduler would not have granted it: the recomputed outcome comes along"
        );
    }

    #[test]
    fn a_window_compares_only_its_entries_but_rebuilds_from_the_start() {
        let mut entries = journal();
        entries[2].decisions.clear(); // before the window: not compared
        let summary = verify(&Header::new("allot"), entries.clone(), Some(10), Some(20)).unwrap();
        assert_eq!(summary.entries, 6, "stops after the window");
        assert!(
            verify(&Header::new("allot"), entries, None, None).is_err(),
            "the whole journal does not verify"
        );
    }
}

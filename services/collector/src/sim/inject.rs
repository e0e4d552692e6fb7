//! Fault injection into a simulated cluster: `allot up --inject KIND:NODE@TIME`.
//!
//! An [`Injection`] names a fault, the simulated node it strikes and when, counted from the
//! start; [`check`] refuses a schedule naming nodes that do not exist (or faults their GPUs
//! cannot have), every problem at once, before anything starts; an [`Injector`] applies the
//! schedule to the nodes' [`SimLoad`] handles as its times come.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use tokio::time::Instant;

use super::{GpuModel, SimFault, SimLoad};

/// NVLink errors one `nvlink` injection adds: a burst, as a flapping link gives.
pub const NVLINK_ERROR_BURST: u64 = 100;

/// What an injection does to its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InjectKind {
    /// Every GPU of the node runs hot, above its slowdown temperature, until the end.
    Overheat,
    /// GPU 0 reads hot in one sample, then normal again.
    Spike,
    /// GPU 0 reports this XID once (e.g. 79: fallen off the bus; 48: double-bit ECC error).
    Xid(u64),
    /// GPU 0 has one more uncorrectable ECC error (the count stays).
    Ecc,
    /// GPU 0 draws more than its power limit until the end.
    Power,
    /// The node's collector stops publishing heartbeats and telemetry, for good, while its
    /// executor goes on running what it runs.
    Partition,
    /// From then on, the node's GPUs that running tasks hold read 0% busy.
    Idle,
    /// GPU 0 fails a row remapping: it is out of spare rows (models that remap rows).
    RowRemap,
    /// GPU 0's NVLinks report a burst of errors (models with NVLink).
    NvLink,
}

/// The kinds as they are written, for errors and help texts.
pub const KINDS: &str = "overheat, spike, xid<N> (e.g. xid79), ecc, power, partition, idle, \
                         rowremap, nvlink";

impl fmt::Display for InjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Overheat => f.write_str("overheat"),
            Self::Spike => f.write_str("spike"),
            Self::Xid(code) => write!(f, "xid{code}"),
            Self::Ecc => f.write_str("ecc"),
            Self::Power => f.write_str("power"),
            Self::Partition => f.write_str("partition"),
            Self::Idle => f.write_str("idle"),
            Self::RowRemap => f.write_str("rowremap"),
            Self::NvLink => f.write_str("nvlink"),
        }
    }
}

impl FromStr for InjectKind {
    type Err = InjectionProblem;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let kind = s.trim().to_ascii_lowercase();
        Ok(match kind.as_str() {
            "overheat" => Self::Overheat,
            "spike" => Self::Spike,
            "ecc" => Self::Ecc,
            "power" => Self::Power,
            "partition" => Self::Partition,
            "idle" => Self::Idle,
            "rowremap" => Self::RowRemap,
            "nvlink" => Self::NvLink,
            _ => match kind.strip_prefix("xid") {
                Some(code) => Self::Xid(code.parse().map_err(|_| InjectionProblem::BadXid {
                    kind: s.trim().to_owned(),
                })?),
                None => {
                    return Err(InjectionProblem::UnknownKind {
                        kind: s.trim().to_owned(),
                    });
                }
            },
        })
    }
}

/// One fault to inject: `KIND:NODE@TIME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injection {
    /// What happens.
    pub kind: InjectKind,
    /// The simulated node it happens to.
    pub node: String,
    /// When, after the start.
    pub at: Duration,
}

impl fmt::Display for Injection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}@{}",
            self.kind,
            self.node,
            humantime::format_duration(self.at)
        )
    }
}

/// One thing wrong with the text of an injection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InjectionProblem {
    /// No `:` after the kind.
    #[error("no ':' after the kind; write KIND:NODE@TIME, e.g. overheat:node-1@30s")]
    MissingColon,
    /// No `@` before the time.
    #[error("no '@' before the time; write KIND:NODE@TIME, e.g. overheat:node-1@30s")]
    MissingAt,
    /// A kind that is not one of [`KINDS`].
    #[error("unknown kind {kind:?}; use one of {KINDS}")]
    UnknownKind {
        /// The kind as written.
        kind: String,
    },
    /// `xid` followed by something other than a number.
    #[error("{kind:?} is not an XID: write xid and its number, e.g. xid79")]
    BadXid {
        /// The kind as written.
        kind: String,
    },
    /// Nothing between `:` and `@`.
    #[error("no node between ':' and '@'")]
    MissingNode,
    /// A time that is not a duration.
    #[error("bad time {time:?}: {reason} (a duration after the start, e.g. 0s, 30s, 2m)")]
    BadTime {
        /// The time as written.
        time: String,
        /// What humantime said.
        reason: String,
    },
}

/// An injection that does not parse, with everything wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidInjection {
    /// The text given.
    pub given: String,
    /// What is wrong with it (never empty).
    pub problems: Vec<InjectionProblem>,
}

impl fmt::Display for InvalidInjection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "injection {:?}: ", self.given)?;
        for (i, problem) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for InvalidInjection {}

impl FromStr for Injection {
    type Err = InvalidInjection;

    /// Parses `KIND:NODE@TIME`, e.g. `xid79:node-2@90s`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = |problems| InvalidInjection {
            given: s.to_owned(),
            problems,
        };
        let Some((kind, rest)) = s.trim().split_once(':') else {
            return Err(invalid(vec![InjectionProblem::MissingColon]));
        };
        let Some((node, time)) = rest.rsplit_once('@') else {
            return Err(invalid(vec![InjectionProblem::MissingAt]));
        };
        let mut problems = Vec::new();
        let kind = kind
            .parse::<InjectKind>()
            .map_err(|problem| problems.push(problem))
            .ok();
        let node = node.trim();
        if node.is_empty() {
            problems.push(InjectionProblem::MissingNode);
        }
        let at = humantime::parse_duration(time.trim())
            .map_err(|e| {
                problems.push(InjectionProblem::BadTime {
                    time: time.to_owned(),
                    reason: e.to_string(),
                });
            })
            .ok();
        match (kind, at) {
            (Some(kind), Some(at)) if problems.is_empty() => Ok(Self {
                kind,
                node: node.to_owned(),
                at,
            }),
            _ => Err(invalid(problems)),
        }
    }
}

/// Why a parsed injection cannot apply to the simulated cluster.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleProblem {
    /// The node is not one of the cluster's.
    #[error("injection {injection:?}: no simulated node {node:?} (the nodes are {known})")]
    UnknownNode {
        /// The injection, as written back.
        injection: String,
        /// The node it names.
        node: String,
        /// The nodes there are, abridged when there are many.
        known: String,
    },
    /// The fault needs hardware the node's GPU model does not have.
    #[error("injection {injection:?}: {node}'s {model} GPUs have no {lacks}")]
    Unsupported {
        /// The injection, as written back.
        injection: String,
        /// The node it names.
        node: String,
        /// The node's GPU model.
        model: GpuModel,
        /// What the model lacks.
        lacks: &'static str,
    },
}

/// Everything wrong with a schedule of injections (never empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidSchedule(pub Vec<ScheduleProblem>);

impl fmt::Display for InvalidSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for InvalidSchedule {}

/// Checks `schedule` against the simulated nodes (name → GPU model): every injection must
/// name one of them, and `nvlink` / `rowremap` a node whose model has NVLink / row remapping.
/// Reports every problem at once.
pub fn check(
    schedule: &[Injection],
    nodes: &BTreeMap<String, GpuModel>,
) -> Result<(), InvalidSchedule> {
    let mut problems = Vec::new();
    for injection in schedule {
        let Some(&model) = nodes.get(&injection.node) else {
            problems.push(ScheduleProblem::UnknownNode {
                injection: injection.to_string(),
                node: injection.node.clone(),
                known: abridged(nodes.keys()),
            });
            continue;
        };
        let lacks = match injection.kind {
            InjectKind::NvLink if !model.has_nvlink() => Some("NVLink"),
            InjectKind::RowRemap if !model.remaps_rows() => Some("row remapping"),
            _ => None,
        };
        if let Some(lacks) = lacks {
            problems.push(ScheduleProblem::Unsupported {
                injection: injection.to_string(),
                node: injection.node.clone(),
                model,
                lacks,
            });
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(InvalidSchedule(problems))
    }
}

/// `a, b, c`, or `a, b, …, z (26 nodes)` when there are many; `none` when there are none.
fn abridged<'a>(names: impl ExactSizeIterator<Item = &'a String>) -> String {
    let count = names.len();
    let names: Vec<&str> = names.map(String::as_str).collect();
    match names.as_slice() {
        [] => "none".to_owned(),
        few if few.len() <= 5 => few.join(", "),
        [first, second, .., last] => format!("{first}, {second}, …, {last} ({count} nodes)"),
        _ => unreachable!("more than five names have a first, a second and a last"),
    }
}

/// Applies a schedule of injections to simulated nodes as their times come.
#[derive(Debug)]
pub struct Injector {
    /// In the order they apply.
    schedule: Vec<Injection>,
    nodes: BTreeMap<String, SimLoad>,
}

impl Injector {
    /// An injector of `schedule` into `nodes` (by name), once [`check`] passes.
    pub fn new(
        mut schedule: Vec<Injection>,
        nodes: BTreeMap<String, SimLoad>,
    ) -> Result<Self, InvalidSchedule> {
        let models = nodes
            .iter()
            .map(|(name, load)| (name.clone(), load.model()))
            .collect();
        check(&schedule, &models)?;
        // Stable: injections at the same time apply in the order given.
        schedule.sort_by_key(|injection| injection.at);
        Ok(Self { schedule, nodes })
    }

    /// Applies each injection at `start` + its time, until the schedule is done; then waits
    /// for `shutdown`. Injections not yet due when `shutdown` completes are not applied.
    pub async fn run(self, start: Instant, shutdown: impl Future<Output = ()>) {
        let apply_all = async {
            for injection in &self.schedule {
                tokio::time::sleep_until(start + injection.at).await;
                let load = &self.nodes[&injection.node];
                apply(injection.kind, load);
                tracing::info!(
                    node = %injection.node,
                    kind = %injection.kind,
                    at_s = injection.at.as_secs_f64(),
                    "fault injected into the simulated node"
                );
            }
            std::future::pending::<()>().await;
        };
        tokio::select! {
            () = shutdown => {}
            () = apply_all => {}
        }
    }
}

/// Makes `kind` happen to the node behind `load`.
pub fn apply(kind: InjectKind, load: &SimLoad) {
    let gpu0 = |fault| {
        // Every simulated node has at least one GPU, so GPU 0 exists.
        let _ = load.inject_fault(0, fault);
    };
    match kind {
        InjectKind::Overheat => {
            for index in 0..load.gpus() {
                let _ = load.inject_fault(index, SimFault::Overheat);
            }
        }
        InjectKind::Spike => gpu0(SimFault::Spike),
        InjectKind::Xid(code) => gpu0(SimFault::Xid(code)),
        InjectKind::Ecc => gpu0(SimFault::EccUncorrected),
        InjectKind::Power => gpu0(SimFault::PowerOverLimit),
        InjectKind::RowRemap => gpu0(SimFault::RowRemapFailure),
        InjectKind::NvLink => gpu0(SimFault::NvLinkErrors(NVLINK_ERROR_BURST)),
        InjectKind::Partition => load.partition(),
        InjectKind::Idle => load.stall(),
    }
}

#[cfg(test)]
mod tests;

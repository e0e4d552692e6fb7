//! The rules: which signal, what threshold, how long a breach must last before it fires
//! (hold-down: a single spike never acts) and how long health must last before it clears (a
//! node that wobbles around the threshold is not returned to service and taken out again).

use serde::{Deserialize, Serialize};

use crate::idle::IdlePolicy;
use crate::xid::XID_RULE;
use crate::{Millis, Signal};

/// What a rule watches, and which way is bad.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RuleKind {
    /// °C left before the GPU's slowdown temperature: bad **below** the threshold.
    ThermalMargin,
    /// Power draw ÷ the power limit: bad above.
    PowerOverLimit,
    /// GPU memory used ÷ its size: bad above.
    MemoryNearFull,
    /// Uncorrectable ECC errors: bad above.
    EccUncorrectable,
    /// Failed row remaps: bad above.
    RowRemapFailures,
    /// NVLink errors: bad above.
    NvlinkErrors,
    /// No heartbeat from the node for the rule's hold-down (the threshold is unused).
    HeartbeatLost,
}

impl RuleKind {
    /// The value this kind compares, if `signal` is one it watches.
    pub fn measure(self, signal: &Signal) -> Option<f64> {
        match (self, *signal) {
            (
                Self::ThermalMargin,
                Signal::Temperature {
                    celsius,
                    slowdown_celsius,
                },
            ) => Some(slowdown_celsius - celsius),
            (Self::PowerOverLimit, Signal::Power { watts, limit_watts }) if limit_watts > 0.0 => {
                Some(watts / limit_watts)
            }
            (
                Self::MemoryNearFull,
                Signal::Memory {
                    used_mib,
                    total_mib,
                },
            ) if total_mib > 0.0 => Some(used_mib / total_mib),
            (Self::EccUncorrectable, Signal::EccUncorrectable(n))
            | (Self::RowRemapFailures, Signal::RowRemapFailures(n))
            | (Self::NvlinkErrors, Signal::NvlinkErrors(n)) => Some(n as f64),
            _ => None,
        }
    }

    /// Whether `value` breaches `threshold`.
    pub fn breaches(self, value: f64, threshold: f64) -> bool {
        match self {
            Self::ThermalMargin => value < threshold,
            Self::HeartbeatLost => false,
            _ => value > threshold,
        }
    }
}

/// What a firing rule asks for, mildest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// Tell the people concerned; touch nothing.
    Alert,
    /// Take the one GPU out of service.
    GpuOutOfService,
    /// No new work on the node; running work stays.
    SoftCordon,
    /// No new work, and the node is out of service.
    Cordon,
    /// Cordon, checkpoint what can be, and move its work elsewhere.
    Drain,
}

impl Action {
    /// Whether the action takes a node (not just a GPU) out of service.
    pub fn takes_node(self) -> bool {
        matches!(self, Self::SoftCordon | Self::Cordon | Self::Drain)
    }
}

/// One rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Its name, in every verdict it gives.
    pub name: String,
    /// What it watches.
    pub kind: RuleKind,
    /// Where bad begins (see [`RuleKind`] for the direction).
    pub threshold: f64,
    /// How long a breach must last before the rule fires, ms (0: at once).
    pub hold_down: Millis,
    /// How long health must last before a firing rule clears, ms.
    pub clear_after: Millis,
    /// What it asks for when it fires.
    pub action: Action,
    /// For a GPU-level rule: when this many GPUs of one node breach it at once, the node is
    /// acted on instead (`node_action`) — one bad GPU is that GPU's problem, several are the
    /// node's (cooling, power, the baseboard).
    pub node_when_gpus: Option<u32>,
    /// What the node gets when `node_when_gpus` is reached.
    pub node_action: Action,
}

/// How XIDs are handled where the catalog leaves a choice ([`crate::xid`] has what each XID
/// class does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidPolicy {
    /// How long a GPU (or node) an XID took out must go without another XID before it returns
    /// to service, ms.
    pub clear_after: Millis,
}

impl Default for XidPolicy {
    fn default() -> Self {
        Self {
            clear_after: 10 * 60_000,
        }
    }
}

/// The rules in force.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleSet {
    /// In file order.
    pub rules: Vec<Rule>,
    /// XIDs (the file's `xid` section).
    pub xid: XidPolicy,
    /// Idle reclaim (the file's `idle` section); `None`: grants are never reclaimed.
    pub idle: Option<IdlePolicy>,
}

/// A rule as written in the file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RuleFile {
    name: Option<String>,
    signal: Option<RuleKind>,
    threshold: Option<f64>,
    #[serde(rename = "for")]
    hold_down: Option<String>,
    clear_after: Option<String>,
    action: Option<Action>,
    node_when_gpus: Option<u32>,
    node_action: Option<Action>,
}

/// The `xid` section as written in the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct XidFile {
    clear_after: Option<String>,
}

/// The `idle` section as written in the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct IdleFile {
    below: Option<String>,
    window: Option<String>,
    warm_up: Option<String>,
    notice: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    rules: Vec<RuleFile>,
    #[serde(default)]
    xid: XidFile,
    #[serde(default)]
    idle: Option<IdleFile>,
}

/// `text` as a duration in ms.
fn millis(text: &str) -> Result<Millis, humantime::DurationError> {
    humantime::parse_duration(text).map(|d| d.as_millis().min(u128::from(Millis::MAX)) as Millis)
}

/// The idle policy the `idle` section asks for (defaults where it is silent).
fn idle_policy(f: &IdleFile, problems: &mut Vec<String>) -> IdlePolicy {
    let mut policy = IdlePolicy::default();
    if let Some(t) = f.below.as_deref() {
        let number = t.trim().strip_suffix('%').unwrap_or(t.trim());
        match number.parse::<f64>() {
            Ok(pct) if (0.0..=100.0).contains(&pct) => policy.below = pct / 100.0,
            _ => problems.push(format!(
                "idle.below: {t:?} is not a utilization between 0% and 100% (e.g. 1%)"
            )),
        }
    }
    let mut duration = |field: &str, text: Option<&str>, into: &mut Millis| {
        if let Some(t) = text {
            match millis(t) {
                Ok(ms) => *into = ms,
                Err(e) => problems.push(format!("idle.{field}: {t:?} is not a duration ({e})")),
            }
        }
    };
    duration("window", f.window.as_deref(), &mut policy.window);
    duration("warmUp", f.warm_up.as_deref(), &mut policy.warm_up);
    duration("notice", f.notice.as_deref(), &mut policy.notice);
    if policy.window == 0 {
        problems.push("idle.window: must be longer than 0 (every grant would be idle)".into());
    } else if policy.notice > policy.window {
        problems.push(format!(
            "idle.notice: {} ms is longer than the window ({} ms): the notice would come before \
             the grant was idle",
            policy.notice, policy.window
        ));
    }
    policy
}

impl RuleSet {
    /// Reads rules (and the optional `xid` section) from YAML; every problem at once, each
    /// naming its rule and field.
    pub fn parse(text: &str) -> Result<Self, Vec<String>> {
        let file: File = yaml_serde::from_str(text).map_err(|e| vec![e.to_string()])?;
        let mut problems = Vec::new();
        let mut rules = Vec::new();
        let mut names = std::collections::BTreeSet::new();
        for (i, r) in file.rules.into_iter().enumerate() {
            let at = format!(
                "rules[{i}]{}",
                r.name.as_ref().map_or(String::new(), |n| format!(" ({n})"))
            );
            let mut problem =
                |field: &str, what: String| problems.push(format!("{at}.{field}: {what}"));
            let name = r.name.clone().unwrap_or_default();
            if name.is_empty() {
                problem("name", "missing".into());
            } else if name == XID_RULE {
                problem(
                    "name",
                    format!("{name:?} is reserved for the verdicts XIDs decide"),
                );
            } else if !names.insert(name.clone()) {
                problem("name", format!("{name:?} is used by an earlier rule"));
            }
            let Some(kind) = r.signal else {
                problem("signal", "missing".into());
                continue;
            };
            let threshold = match (kind, r.threshold) {
                (RuleKind::HeartbeatLost, t) => t.unwrap_or(0.0),
                (_, Some(t)) if t.is_finite() => t,
                (_, Some(t)) => {
                    problem("threshold", format!("{t} is not a finite number"));
                    0.0
                }
                (_, None) => {
                    problem("threshold", "missing".into());
                    0.0
                }
            };
            let mut duration = |field: &str, text: Option<&str>, default: Millis| match text {
                None => default,
                Some(t) => match millis(t) {
                    Ok(ms) => ms,
                    Err(e) => {
                        problems.push(format!("{at}.{field}: {t:?} is not a duration ({e})"));
                        default
                    }
                },
            };
            let hold_down = duration("for", r.hold_down.as_deref(), 0);
            let clear_after = duration("clearAfter", r.clear_after.as_deref(), 300_000);
            let mut problem =
                |field: &str, what: String| problems.push(format!("{at}.{field}: {what}"));
            if kind == RuleKind::HeartbeatLost && hold_down == 0 {
                problem(
                    "for",
                    "a lost heartbeat needs the silence it waits for (e.g. 30s)".into(),
                );
            }
            let action = r.action.unwrap_or_else(|| {
                problem("action", "missing".into());
                Action::Alert
            });
            if r.node_when_gpus == Some(0) {
                problem("nodeWhenGpus", "must be at least 1".into());
            }
            rules.push(Rule {
                name,
                kind,
                threshold,
                hold_down,
                clear_after,
                action,
                node_when_gpus: r.node_when_gpus,
                node_action: r.node_action.unwrap_or(Action::Drain),
            });
        }
        let mut xid = XidPolicy::default();
        if let Some(t) = file.xid.clear_after.as_deref() {
            match millis(t) {
                Ok(0) => problems.push(
                    "xid.clearAfter: must be longer than 0 (a GPU would return at once)".into(),
                ),
                Ok(ms) => xid.clear_after = ms,
                Err(e) => problems.push(format!("xid.clearAfter: {t:?} is not a duration ({e})")),
            }
        }
        let idle = file.idle.map(|f| idle_policy(&f, &mut problems));
        if problems.is_empty() {
            Ok(Self { rules, xid, idle })
        } else {
            Err(problems)
        }
    }
}

impl Default for RuleSet {
    /// The rules Allot ships (`examples/health-rules.yaml` spells them out).
    fn default() -> Self {
        Self::parse(DEFAULT_RULES).expect("the built-in rules are valid")
    }
}

/// The built-in rules.
pub const DEFAULT_RULES: &str = r#"
rules:
  - {name: overheat, signal: thermal-margin, threshold: 3, for: 5s, clearAfter: 5m, action: gpu-out-of-service, nodeWhenGpus: 2, nodeAction: drain}
  - {name: power-over-limit, signal: power-over-limit, threshold: 1.05, for: 60s, clearAfter: 5m, action: alert}
  - {name: memory-near-full, signal: memory-near-full, threshold: 0.97, for: 60s, clearAfter: 1m, action: alert}
  - {name: ecc-uncorrectable, signal: ecc-uncorrectable, threshold: 0, action: gpu-out-of-service, clearAfter: 1h, nodeWhenGpus: 2, nodeAction: drain}
  - {name: row-remap-failure, signal: row-remap-failures, threshold: 0, action: gpu-out-of-service, clearAfter: 24h}
  - {name: nvlink-errors, signal: nvlink-errors, threshold: 100, for: 5m, clearAfter: 30m, action: alert}
  - {name: heartbeat-lost, signal: heartbeat-lost, for: 30s, clearAfter: 2m, action: drain}
xid: {clearAfter: 10m}
"#;

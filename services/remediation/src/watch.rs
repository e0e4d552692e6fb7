//! What remediation knows and decides, pure: collector events go in, [`ActionTaken`]s come
//! out. It drives the health rules ([`allot_health::Engine`]) with readings taken from
//! telemetry and heartbeats, and turns their verdicts into actions:
//!
//! - which runs an action affects (from the node's last telemetry: what held each GPU);
//! - the circuit breaker: a node action past its cap becomes an alert, and that node is not
//!   held (so its clearing returns nothing);
//! - who holds what: a node is held while any of remediation's rules holds it, and returned
//!   to service when the last one clears; a GPU likewise;
//! - requests to an actuator (reset the GPU, reboot the node) as actions of their own.
//!
//! What it knows is stored with the stream positions in one transaction, so a restart resumes
//! exactly where the last commit left it — split as a fleet needs it: a [`NodeRecord`] per
//! node, a row per grant idle reclaim watches, and one small [`Pool`] row. A batch stores only
//! the nodes and grants it changed ([`Watch::take_changes`]), so a commit costs what the batch
//! did, not the size of the fleet.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, TimeZone, Utc};
use serde::{Deserialize, Serialize};

use allot_events::remediation::{Action, ActionTaken, Affected, Evidence};
use allot_events::telemetry::{GpuSample, GpusSampled};
use allot_health::{
    Action as RuleAction, Audience, Breaker, Change, Engine, Grant, Idle, IdleWatch, Millis,
    NodeHealth, Reading, Request, RuleKind, RuleSet, Signal, Snapshot, Verdict,
};

/// The rule name idle reclaim's actions carry.
pub const IDLE_RULE: &str = "idle-reclaim";

/// The slowdown temperature assumed for a GPU whose telemetry does not report its own, °C.
pub const DEFAULT_SLOWDOWN_C: u32 = 90;

/// The circuit breaker's settings: at most `share` of the nodes within `window`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BreakerPolicy {
    /// Share of the registered nodes (at least one node).
    pub share: f64,
    /// The window, ms.
    pub window: Millis,
}

impl Default for BreakerPolicy {
    /// A tenth of the nodes per ten minutes.
    fn default() -> Self {
        Self {
            share: 0.1,
            window: 10 * 60_000,
        }
    }
}

/// Everything remediation knew, as versions before 2026-11-26 stored it: one row, written
/// whole on every commit. Read once and stored again node by node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct State {
    engine: Snapshot,
    breaker: Breaker,
    /// Registered nodes.
    nodes: BTreeSet<String>,
    /// Per node, the runs its last telemetry showed: (GPU, run).
    runs: BTreeMap<String, Vec<(u32, Affected)>>,
    /// Per node, the rules of remediation's holding it out of service.
    held: BTreeMap<String, BTreeSet<String>>,
    /// Per node and GPU, the rules holding that GPU out of service.
    gpus_out: BTreeMap<String, BTreeMap<u32, BTreeSet<String>>>,
    /// Idle reclaim's grants, when it is on.
    #[serde(default)]
    idle: Option<IdleWatch>,
}

/// What remediation knows of one node, as stored: whether it registered, the runs its last
/// telemetry showed, what remediation holds out of service there, and the rules' state of it.
/// A node with none of these has no record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    registered: bool,
    /// (GPU, run).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    runs: Vec<(u32, Affected)>,
    /// Remediation's rules holding the node out of service.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    held: BTreeSet<String>,
    /// Per GPU, the rules holding it out of service.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    gpus_out: BTreeMap<u32, BTreeSet<String>>,
    #[serde(default, skip_serializing_if = "NodeHealth::is_empty")]
    health: NodeHealth,
}

impl NodeRecord {
    /// Whether there is nothing to keep.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// What remediation knows of the pool as a whole, as stored (one small row).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pool {
    /// The rules the records' rule states were kept under, by name, in order.
    rules: Vec<String>,
    breaker: Breaker,
}

/// Everything remediation knows, as stored: the pool, every node's record and every grant
/// idle reclaim watches.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Stored {
    /// The pool.
    pub pool: Pool,
    /// Each node's record, by node.
    pub nodes: Vec<(String, NodeRecord)>,
    /// Each watched grant, by lease.
    pub grants: Vec<(u64, Grant)>,
}

/// What changed since [`Watch::take_changes`] was last called: the pool (always; it is small),
/// and the records and grants to write again or, where `None`, to forget.
#[derive(Debug, Clone)]
pub struct Changes {
    /// The pool as it is now.
    pub pool: Pool,
    /// Nodes whose record changed, with the record (`None`: nothing left to keep).
    pub nodes: Vec<(String, Option<NodeRecord>)>,
    /// Leases whose grant changed, with the grant (`None`: no longer watched).
    pub grants: Vec<(u64, Option<Grant>)>,
}

impl Changes {
    /// Whether no node or grant changed.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty() && self.grants.is_empty()
    }
}

/// The rules' engine and what remediation did with its verdicts.
#[derive(Debug, Clone)]
pub struct Watch {
    rules: RuleSet,
    policy: BreakerPolicy,
    engine: Engine,
    breaker: Breaker,
    nodes: BTreeSet<String>,
    runs: BTreeMap<String, Vec<(u32, Affected)>>,
    held: BTreeMap<String, BTreeSet<String>>,
    gpus_out: BTreeMap<String, BTreeMap<u32, BTreeSet<String>>>,
    idle: Option<IdleWatch>,
    /// Nodes whose record (but for the engine's part, which it tracks itself) changed since
    /// the last [`Watch::take_changes`].
    dirty_nodes: BTreeSet<String>,
    /// Leases whose grant changed since then.
    dirty_grants: BTreeSet<u64>,
}

impl Watch {
    /// A watch under `rules` that has seen nothing.
    pub fn new(rules: RuleSet, policy: BreakerPolicy) -> Self {
        Self {
            engine: Engine::new(rules.clone()),
            breaker: Breaker::new(policy.share, 0, policy.window),
            idle: rules.idle.map(IdleWatch::new),
            rules,
            policy,
            nodes: BTreeSet::new(),
            runs: BTreeMap::new(),
            held: BTreeMap::new(),
            gpus_out: BTreeMap::new(),
            dirty_nodes: BTreeSet::new(),
            dirty_grants: BTreeSet::new(),
        }
    }

    /// A watch under `rules` that has seen what `stored` says.
    pub fn restore(rules: RuleSet, policy: BreakerPolicy, stored: Stored) -> Self {
        let mut watch = Self::new(rules.clone(), policy);
        let mut health = Vec::with_capacity(stored.nodes.len());
        for (node, record) in stored.nodes {
            if record.registered {
                watch.nodes.insert(node.clone());
            }
            if !record.runs.is_empty() {
                watch.runs.insert(node.clone(), record.runs);
            }
            if !record.held.is_empty() {
                watch.held.insert(node.clone(), record.held);
            }
            if !record.gpus_out.is_empty() {
                watch.gpus_out.insert(node.clone(), record.gpus_out);
            }
            health.push((node, record.health));
        }
        watch.engine = Engine::restore_nodes(rules, &stored.pool.rules, health);
        watch.breaker = stored.pool.breaker;
        watch.breaker.window = policy.window;
        watch.breaker.resize(policy.share, watch.nodes.len());
        // The grants watched are kept; the policy is the one configured now. With idle reclaim
        // switched off, they are forgotten by the next commit.
        for (lease, grant) in stored.grants {
            match &mut watch.idle {
                Some(idle) => idle.restore_grant(lease, grant),
                None => {
                    watch.dirty_grants.insert(lease);
                }
            }
        }
        watch
    }

    /// A watch under `rules` that has seen what a `state` stored whole (by an earlier version)
    /// says; everything counts as changed, so the next commit stores it node by node.
    pub fn restore_whole(rules: RuleSet, policy: BreakerPolicy, state: State) -> Self {
        let mut breaker = state.breaker;
        breaker.window = policy.window;
        breaker.resize(policy.share, state.nodes.len());
        // The grants watched are kept; the policy is the one configured now.
        let idle = rules.idle.map(|policy| {
            let mut watch = IdleWatch::new(policy);
            if let Some(old) = state.idle {
                watch.adopt(old);
            }
            watch
        });
        let mut watch = Self {
            engine: Engine::restore(rules.clone(), state.engine),
            breaker,
            idle,
            rules,
            policy,
            nodes: state.nodes,
            runs: state.runs,
            held: state.held,
            gpus_out: state.gpus_out,
            dirty_nodes: BTreeSet::new(),
            dirty_grants: BTreeSet::new(),
        };
        watch.mark_all_changed();
        watch
    }

    /// Counts everything as changed: the next [`Watch::take_changes`] returns every record
    /// and grant (to store the whole state, as into a fresh database).
    pub fn mark_all_changed(&mut self) {
        self.dirty_nodes = self.known_nodes();
        self.dirty_grants = self.idle.iter().flat_map(IdleWatch::leases).collect();
    }

    /// Every node it knows anything of.
    fn known_nodes(&self) -> BTreeSet<String> {
        let mut all: BTreeSet<String> = self.nodes.iter().cloned().collect();
        all.extend(self.runs.keys().cloned());
        all.extend(self.held.keys().cloned());
        all.extend(self.gpus_out.keys().cloned());
        all.extend(self.engine.node_names());
        all
    }

    /// What it knows of `node`, as stored.
    fn record(&self, node: &str) -> NodeRecord {
        NodeRecord {
            registered: self.nodes.contains(node),
            runs: self.runs.get(node).cloned().unwrap_or_default(),
            held: self.held.get(node).cloned().unwrap_or_default(),
            gpus_out: self.gpus_out.get(node).cloned().unwrap_or_default(),
            health: self.engine.node(node).cloned().unwrap_or_default(),
        }
    }

    fn pool(&self) -> Pool {
        Pool {
            rules: self.engine.rule_names(),
            breaker: self.breaker.clone(),
        }
    }

    /// Everything it knows, as stored.
    pub fn stored(&self) -> Stored {
        Stored {
            pool: self.pool(),
            nodes: self
                .known_nodes()
                .into_iter()
                .map(|n| {
                    let record = self.record(&n);
                    (n, record)
                })
                .filter(|(_, r)| !r.is_empty())
                .collect(),
            grants: self
                .idle
                .iter()
                .flat_map(|idle| idle.leases().filter_map(|l| Some((l, idle.grant(l)?))))
                .collect(),
        }
    }

    /// What changed since the last call (the first call after [`Watch::restore_whole`]:
    /// everything), forgotten as it is returned: the caller stores it.
    pub fn take_changes(&mut self) -> Changes {
        let mut nodes = std::mem::take(&mut self.dirty_nodes);
        nodes.extend(self.engine.take_touched());
        let grants = std::mem::take(&mut self.dirty_grants);
        Changes {
            pool: self.pool(),
            nodes: nodes
                .into_iter()
                .map(|n| {
                    let record = self.record(&n);
                    (n, (!record.is_empty()).then_some(record))
                })
                .collect(),
            grants: grants
                .into_iter()
                .map(|l| (l, self.idle.as_ref().and_then(|idle| idle.grant(l))))
                .collect(),
        }
    }

    /// The nodes remediation holds out of service, with the rules holding each.
    pub fn held(&self) -> &BTreeMap<String, BTreeSet<String>> {
        &self.held
    }

    /// A node registered (again).
    pub fn registered(&mut self, node: &str) {
        if self.nodes.insert(node.to_owned()) {
            self.breaker.resize(self.policy.share, self.nodes.len());
            self.dirty_nodes.insert(node.to_owned());
        }
    }

    /// A node's heartbeat, stored by the bus at `at`.
    pub fn heartbeat(&mut self, node: &str, at: Millis) -> Vec<ActionTaken> {
        let verdicts = self.engine.observe(&Reading {
            node: node.to_owned(),
            gpu: None,
            at,
            signal: Signal::Heartbeat,
        });
        self.act(verdicts)
    }

    /// A node's GPU samples, stored by the bus at `at`.
    pub fn sampled(&mut self, sampled: &GpusSampled, at: Millis) -> Vec<ActionTaken> {
        let before = self.runs.get(&sampled.node).map_or(&[][..], Vec::as_slice);
        let same = before.len() == sampled.held.len()
            && before.iter().zip(&sampled.held).all(|((gpu, run), h)| {
                *gpu == h.index
                    && run.lease == h.lease
                    && run.workload == h.workload
                    && run.task == h.task
                    && run.team == h.team
            });
        // The leases its last samples showed and these do not: ended or moved.
        let mut gone = Vec::new();
        if !same {
            gone = before
                .iter()
                .filter(|(_, run)| !sampled.held.iter().any(|h| h.lease == run.lease))
                .map(|(_, run)| run.lease.0)
                .collect();
            let runs: Vec<(u32, Affected)> = sampled
                .held
                .iter()
                .map(|h| {
                    (
                        h.index,
                        Affected {
                            lease: h.lease,
                            workload: h.workload.clone(),
                            task: h.task.clone(),
                            team: h.team.clone(),
                        },
                    )
                })
                .collect();
            if runs.is_empty() {
                self.runs.remove(&sampled.node);
            } else {
                self.runs.insert(sampled.node.clone(), runs);
            }
            self.dirty_nodes.insert(sampled.node.clone());
        }
        let mut out = self.idle_reclaim(sampled, gone, at);
        let mut verdicts = Vec::new();
        let mut reading = Reading {
            node: sampled.node.clone(),
            gpu: None,
            at,
            signal: Signal::Heartbeat,
        };
        for sample in &sampled.samples {
            reading.gpu = Some(sample.index);
            for signal in signals(sample) {
                reading.signal = signal;
                verdicts.extend(self.engine.observe(&reading));
            }
        }
        out.extend(self.act(verdicts));
        out
    }

    /// Idle reclaim over one node's samples: each run's mean utilization over its GPUs here;
    /// `gone` are the leases its previous samples showed and these do not (forgotten).
    fn idle_reclaim(
        &mut self,
        sampled: &GpusSampled,
        gone: Vec<u64>,
        at: Millis,
    ) -> Vec<ActionTaken> {
        let Some(idle) = &mut self.idle else {
            return Vec::new();
        };
        let policy = idle.policy();
        let mut runs: BTreeMap<u64, (f64, u32, bool, Affected)> = BTreeMap::new();
        for h in &sampled.held {
            let Some(util) = sampled
                .samples
                .iter()
                .find(|s| s.index == h.index)
                .and_then(|s| s.utilization_pct)
            else {
                continue;
            };
            let run = runs.entry(h.lease.0).or_insert_with(|| {
                let affected = Affected {
                    lease: h.lease,
                    workload: h.workload.clone(),
                    task: h.task.clone(),
                    team: h.team.clone(),
                };
                (0.0, 0, h.no_idle_reclaim, affected)
            });
            run.0 += f64::from(util) / 100.0;
            run.1 += 1;
        }
        for lease in gone {
            if idle.watches(lease) {
                idle.released(lease);
                self.dirty_grants.insert(lease);
            }
        }
        let mut out = Vec::new();
        for (lease, (sum, n, opted_out, run)) in runs {
            let before = idle.grant(lease);
            if before.is_none() {
                idle.granted(lease, at, opted_out);
            }
            let mean = sum / f64::from(n);
            let decided = idle.observe(lease, mean, at);
            if idle.grant(lease) != before {
                self.dirty_grants.insert(lease);
            }
            let Some(decided) = decided else {
                continue;
            };
            let (action, r, what) = match decided {
                Idle::Notice(r) => (
                    Action::Alert,
                    r,
                    format!(
                        "idle since {}: its GPUs will be reclaimed in {} s unless they get busy",
                        time(r.idle_since).to_rfc3339(),
                        policy.notice / 1000
                    ),
                ),
                Idle::Reclaim(r) => (
                    Action::IdleReclaim,
                    r,
                    format!(
                        "idle since {}: under {}% for {} s; stopped and requeued",
                        time(r.idle_since).to_rfc3339(),
                        policy.below * 100.0,
                        policy.window / 1000
                    ),
                ),
            };
            out.push(ActionTaken {
                node: sampled.node.clone(),
                gpu: None,
                action,
                rule: IDLE_RULE.to_owned(),
                reason: format!(
                    "{IDLE_RULE}: {}/{} (lease {}) on {}: {what}",
                    run.workload, run.task, lease, sampled.node
                ),
                evidence: vec![Evidence {
                    signal: "gpu_utilization".into(),
                    gpu: None,
                    value: mean,
                    threshold: Some(policy.below),
                    at: time(r.at),
                }],
                since: time(r.idle_since),
                team: (!run.team.is_empty()).then(|| run.team.clone()),
                tasks: vec![run],
                downgraded: None,
            });
        }
        out
    }

    /// An operator cordoned or uncordoned `node`.
    pub fn operator(&mut self, node: &str, cordoned: bool) {
        self.engine.operator_cordon(node, cordoned);
    }

    /// Time passed to `now` (lost heartbeats, healthy spells that end with no reading).
    pub fn tick(&mut self, now: Millis) -> Vec<ActionTaken> {
        let verdicts = self.engine.tick(now);
        self.act(verdicts)
    }

    /// The actions `verdicts` mean.
    fn act(&mut self, verdicts: Vec<Verdict>) -> Vec<ActionTaken> {
        let mut out = Vec::new();
        for v in verdicts {
            self.act_on(&v, &mut out);
        }
        out
    }

    fn act_on(&mut self, v: &Verdict, out: &mut Vec<ActionTaken>) {
        // What remediation holds there may change. Every verdict comes from a change the
        // engine already counts as touching the node; marked here too so that what is stored
        // does not rest on that (the breaker is the pool's, stored always).
        if !self.dirty_nodes.contains(&v.node) {
            self.dirty_nodes.insert(v.node.clone());
        }
        let node = v.node.clone();
        match (v.change, v.action) {
            (Change::Fire, RuleAction::Alert) => out.push(self.action(v, Action::Alert, None)),
            (Change::Fire, RuleAction::GpuOutOfService) => {
                let Some(gpu) = v.gpu else {
                    out.push(self.action(v, Action::Alert, Some("no GPU named".into())));
                    return;
                };
                let rules = self
                    .gpus_out
                    .entry(node)
                    .or_default()
                    .entry(gpu)
                    .or_default();
                let first = rules.is_empty();
                rules.insert(v.rule.clone());
                if first {
                    out.push(self.action(v, Action::GpuOutOfService, None));
                }
            }
            (
                Change::Fire,
                a @ (RuleAction::SoftCordon | RuleAction::Cordon | RuleAction::Drain),
            ) => {
                let already = self.held.get(&node).is_some_and(|r| !r.is_empty());
                if !already && !self.breaker.admit(v.at) {
                    let why = format!(
                        "circuit breaker: at most {} node(s) out per {} s",
                        self.breaker.max_nodes,
                        self.breaker.window / 1000
                    );
                    out.push(self.action(v, Action::Alert, Some(why)));
                    return;
                }
                self.held.entry(node).or_default().insert(v.rule.clone());
                let action = match a {
                    RuleAction::SoftCordon => Action::SoftCordon,
                    RuleAction::Cordon => Action::Cordon,
                    _ => Action::Drain,
                };
                out.push(self.action(v, action, None));
            }
            (Change::Clear, RuleAction::GpuOutOfService) => {
                let Some(gpu) = v.gpu else { return };
                let Some(rules) = self.gpus_out.get_mut(&node).and_then(|g| g.get_mut(&gpu)) else {
                    return;
                };
                if rules.remove(&v.rule) && rules.is_empty() {
                    if let Some(g) = self.gpus_out.get_mut(&node) {
                        g.remove(&gpu);
                        if g.is_empty() {
                            self.gpus_out.remove(&node);
                        }
                    }
                    out.push(self.action(v, Action::GpuReturnToService, None));
                }
            }
            (Change::Clear, RuleAction::SoftCordon | RuleAction::Cordon | RuleAction::Drain) => {
                let Some(rules) = self.held.get_mut(&node) else {
                    return;
                };
                if rules.remove(&v.rule) && rules.is_empty() {
                    self.held.remove(&node);
                    out.push(self.action(v, Action::ReturnToService, None));
                }
            }
            (Change::Clear, RuleAction::Alert) => {}
        }
        if v.change == Change::Fire {
            match v.request {
                Some(Request::ResetGpu) => out.push(self.action(v, Action::ResetRequest, None)),
                Some(Request::RebootNode) => out.push(self.action(v, Action::RebootRequest, None)),
                None => {}
            }
        }
    }

    /// The event for `action` taken on verdict `v`.
    fn action(&self, v: &Verdict, action: Action, downgraded: Option<String>) -> ActionTaken {
        let (signal, threshold) = self.measured(&v.rule);
        let on_gpu = |g: &u32| v.gpu.is_none_or(|want| want == *g);
        let mut tasks: Vec<Affected> = self
            .runs
            .get(&v.node)
            .into_iter()
            .flatten()
            .filter(|(g, _)| on_gpu(g))
            .map(|(_, run)| run.clone())
            .collect();
        tasks.sort();
        tasks.dedup();
        let team = (v.audience == Audience::Team)
            .then(|| tasks.iter().map(|t| t.team.clone()).find(|t| !t.is_empty()))
            .flatten();
        let what = match v.gpu {
            Some(g) => format!("GPU {g} of {}", v.node),
            None => v.node.clone(),
        };
        let reading = match (v.change, threshold) {
            (Change::Clear, _) => format!("healthy since {}", time(v.since).to_rfc3339()),
            (Change::Fire, Some(t)) => format!("{signal} {} (threshold {t})", v.value),
            (Change::Fire, None) => format!("{signal} {}", v.value),
        };
        let mut reason = format!("{}: {what}: {reading}", v.rule);
        if let Some(note) = v.note.as_ref().or(downgraded.as_ref()) {
            reason.push_str(&format!(" ({note})"));
        }
        ActionTaken {
            node: v.node.clone(),
            gpu: v.gpu,
            action,
            rule: v.rule.clone(),
            reason,
            evidence: vec![Evidence {
                signal: signal.to_owned(),
                gpu: v.gpu,
                value: v.value,
                threshold,
                at: time(v.at),
            }],
            since: time(v.since),
            tasks,
            team,
            downgraded: downgraded.or_else(|| v.note.clone()),
        }
    }

    /// What rule `name` measures, and its threshold.
    fn measured(&self, name: &str) -> (&'static str, Option<f64>) {
        let Some(rule) = self.rules.rules.iter().find(|r| r.name == name) else {
            return ("xid", None);
        };
        let signal = match rule.kind {
            RuleKind::ThermalMargin => "thermal_margin_c",
            RuleKind::PowerOverLimit => "power_over_limit",
            RuleKind::MemoryNearFull => "memory_used_share",
            RuleKind::EccUncorrectable => "ecc_uncorrectable",
            RuleKind::RowRemapFailures => "row_remap_failures",
            RuleKind::NvlinkErrors => "nvlink_errors",
            RuleKind::HeartbeatLost => return ("heartbeat_silence_ms", None),
        };
        (signal, Some(rule.threshold))
    }
}

/// The health signals in one GPU sample (absent readings give none). The thermal margin is
/// taken against the GPU's own slowdown temperature, [`DEFAULT_SLOWDOWN_C`] when it reports
/// none; every XID since the previous sample is one reading.
pub fn signals(s: &GpuSample) -> Vec<Signal> {
    let mut out = Vec::new();
    if let Some(t) = s.temperature_c {
        out.push(Signal::Temperature {
            celsius: f64::from(t),
            slowdown_celsius: f64::from(s.slowdown_temperature_c.unwrap_or(DEFAULT_SLOWDOWN_C)),
        });
    }
    if let (Some(p), Some(limit)) = (s.power_mw, s.power_limit_mw) {
        out.push(Signal::Power {
            watts: p as f64 / 1000.0,
            limit_watts: limit as f64 / 1000.0,
        });
    }
    if s.memory_total_mib > 0 {
        out.push(Signal::Memory {
            used_mib: s.memory_used_mib as f64,
            total_mib: s.memory_total_mib as f64,
        });
    }
    if let Some(n) = s.ecc_uncorrected {
        out.push(Signal::EccUncorrectable(n));
    }
    if let Some(failed) = s.row_remap_failed {
        out.push(Signal::RowRemapFailures(u64::from(failed)));
    }
    if let Some(n) = s.nvlink_errors {
        out.push(Signal::NvlinkErrors(n));
    }
    out.extend(s.xids.iter().map(|code| Signal::Xid(*code)));
    out
}

/// Milliseconds since the epoch as a time.
pub fn time(ms: Millis) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms as i64)
        .single()
        .unwrap_or_default()
}

/// A time as milliseconds since the epoch.
pub fn millis(t: DateTime<Utc>) -> Millis {
    t.timestamp_millis().max(0) as Millis
}

#[cfg(test)]
mod tests;

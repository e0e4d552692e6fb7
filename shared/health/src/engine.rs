//! Per rule, node and GPU: healthy → breaching (the hold-down runs) → firing → recovering
//! (health must last `clear_after`) → healthy. A breach that ends before its hold-down — a
//! single spike — never fires; a firing rule that sees one bad reading while recovering starts
//! its healthy spell over. Each firing and each clearing is one [`Verdict`].
//!
//! XIDs are events, not levels: an XID reading decides its verdict at once, by its class in
//! NVIDIA's catalog ([`crate::xid`]), with no hold-down. What an XID took out of service
//! returns after `xid.clearAfter` with no further XID there.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::rules::{Action, RuleKind, RuleSet};
use crate::xid::{self, XID_RULE};
use crate::{Millis, Reading, Signal};

/// A rule fired, or cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Act: the breach lasted its hold-down.
    Fire,
    /// Undo: health lasted `clear_after` (return to service).
    Clear,
}

/// Who must hear of a verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Audience {
    /// The operators of the pool: capacity changes, hardware, anything unexplained.
    Operators,
    /// The team whose task runs on the verdict's GPU: its application faulted, the hardware is
    /// fine. The engine knows GPUs, not tasks — remediation finds the task.
    Team,
}

/// What a verdict asks an external actuator to do, besides the capacity change its
/// [`Action`] makes. Kept apart from the action so that what is out of service (and comes
/// back with [`Change::Clear`]) stays one thing: a reset is asked for once, never undone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Request {
    /// Reset the verdict's GPU (its action takes that GPU out of service meanwhile).
    ResetGpu,
    /// Reboot the verdict's node (its action drains the node first).
    RebootNode,
}

/// What remediation should do, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The rule.
    pub rule: String,
    /// The node.
    pub node: String,
    /// The GPU, for a GPU-level verdict.
    pub gpu: Option<u32>,
    /// What to do (undo, for [`Change::Clear`]).
    pub action: Action,
    /// Fire or clear.
    pub change: Change,
    /// The reading that decided it (the silence in ms, for a lost heartbeat; the code, for an
    /// XID).
    pub value: f64,
    /// When the breach (or the healthy spell) began.
    pub since: Millis,
    /// When it was decided.
    pub at: Millis,
    /// Why the action is milder than it would be, if it is (an operator's cordon is kept; an
    /// XID is not in the catalog table; an XID named no GPU).
    pub note: Option<String>,
    /// Who must hear of it.
    pub audience: Audience,
    /// What an actuator is asked to do (only ever on [`Change::Fire`]).
    pub request: Option<Request>,
    /// The XID code, for a verdict an XID decided (its rule is [`XID_RULE`]; its class is
    /// [`xid::class`]); for a [`Change::Clear`], the last XID seen there.
    pub xid: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
enum State {
    Breaching { since: Millis },
    Firing { healthy_since: Option<Millis> },
}

type Key = (usize, String, Option<u32>);

/// Capacity an XID took: a node's GPU, or the node (`None`).
type XidKey = (String, Option<u32>);

/// Capacity an XID took, and the last XID there: the healthy spell runs from it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct XidHold {
    action: Action,
    last_at: Millis,
    last_code: u64,
}

/// What the rules know of one node: its last heartbeat, each rule's state on it and on each of
/// its GPUs, and what an operator or an XID holds there. Healthy GPUs and rules have no entry,
/// so a node the rules are quiet about holds its heartbeat and nothing else. Kept per node so
/// that remediation can store what a batch changed, node by node ([`Engine::take_touched`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeHealth {
    /// Its last heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    heartbeat: Option<Millis>,
    /// (rule, GPU or `None` for the node) → state: breaching or firing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    rules: Vec<(usize, Option<u32>, State)>,
    /// Rules escalated from its GPUs to the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    escalated: Vec<usize>,
    /// An operator cordoned it: remediation leaves it alone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    operator: bool,
    /// Its GPUs (or itself, `None`) out of service because of an XID, by GPU.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    xid_held: Vec<(Option<u32>, XidHold)>,
}

impl NodeHealth {
    /// Whether it holds nothing (a node never seen).
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    fn rule(&self, idx: usize, gpu: Option<u32>) -> Option<State> {
        self.rules
            .iter()
            .find(|(i, g, _)| *i == idx && *g == gpu)
            .map(|(_, _, s)| *s)
    }

    /// Sets (or, with `None`, removes) a rule's state.
    fn set_rule(&mut self, idx: usize, gpu: Option<u32>, state: Option<State>) {
        let at = self
            .rules
            .iter()
            .position(|(i, g, _)| *i == idx && *g == gpu);
        match (at, state) {
            (Some(at), Some(s)) => self.rules[at].2 = s,
            (Some(at), None) => {
                self.rules.remove(at);
            }
            (None, Some(s)) => self.rules.push((idx, gpu, s)),
            (None, None) => {}
        }
    }

    fn xid_hold(&self, gpu: Option<u32>) -> Option<&XidHold> {
        self.xid_held
            .iter()
            .find(|(g, _)| *g == gpu)
            .map(|(_, h)| h)
    }
}

/// The rules' state over every node and GPU seen.
#[derive(Debug, Clone)]
pub struct Engine {
    rules: RuleSet,
    nodes: BTreeMap<String, NodeHealth>,
    /// Nodes whose [`NodeHealth`] changed since [`Engine::take_touched`] last asked.
    touched: BTreeSet<String>,
}

/// What an [`Engine`] has seen, to be stored and restored (its rules are configuration, not
/// state: they are named so state is kept only for the rules it was made under).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The names of the rules the state's rule indices refer to, in order.
    rules: Vec<String>,
    state: Vec<(Key, State)>,
    heartbeats: Vec<(String, Millis)>,
    escalated: Vec<(usize, String)>,
    operator: Vec<String>,
    xid_held: Vec<(XidKey, XidHold)>,
}

impl Engine {
    /// What it has seen, to store whole (remediation stores it node by node instead:
    /// [`Engine::rule_names`], [`Engine::node`]).
    pub fn snapshot(&self) -> Snapshot {
        let mut snapshot = Snapshot {
            rules: self.rule_names(),
            state: Vec::new(),
            heartbeats: Vec::new(),
            escalated: Vec::new(),
            operator: Vec::new(),
            xid_held: Vec::new(),
        };
        for (node, health) in &self.nodes {
            let mut rules = health.rules.clone();
            rules.sort_by_key(|(i, g, _)| (*i, *g));
            snapshot
                .state
                .extend(rules.into_iter().map(|(i, g, s)| ((i, node.clone(), g), s)));
            if let Some(at) = health.heartbeat {
                snapshot.heartbeats.push((node.clone(), at));
            }
            snapshot
                .escalated
                .extend(health.escalated.iter().map(|i| (*i, node.clone())));
            if health.operator {
                snapshot.operator.push(node.clone());
            }
            snapshot.xid_held.extend(
                health
                    .xid_held
                    .iter()
                    .map(|(g, h)| ((node.clone(), *g), *h)),
            );
        }
        snapshot.state.sort_by(|a, b| a.0.cmp(&b.0));
        snapshot.escalated.sort();
        snapshot
    }

    /// An engine under `rules` that has seen what `snapshot` says. Rule states are kept only
    /// if the rules are the same ones, in the same order; otherwise they start over (the
    /// heartbeats, operators' cordons and XID holds are kept either way).
    pub fn restore(rules: RuleSet, snapshot: Snapshot) -> Self {
        let mut nodes: BTreeMap<String, NodeHealth> = BTreeMap::new();
        for ((idx, node, gpu), state) in snapshot.state {
            nodes.entry(node).or_default().rules.push((idx, gpu, state));
        }
        for (node, at) in snapshot.heartbeats {
            nodes.entry(node).or_default().heartbeat = Some(at);
        }
        for (idx, node) in snapshot.escalated {
            nodes.entry(node).or_default().escalated.push(idx);
        }
        for node in snapshot.operator {
            nodes.entry(node).or_default().operator = true;
        }
        for ((node, gpu), hold) in snapshot.xid_held {
            nodes.entry(node).or_default().xid_held.push((gpu, hold));
        }
        Self::restore_nodes(rules, &snapshot.rules, nodes)
    }

    /// An engine under `rules` that has seen what `nodes` say, their rule indices referring
    /// to `names` (the [`Engine::rule_names`] they were stored under). As with
    /// [`Engine::restore`], rule states are kept only if the rules are the same ones.
    pub fn restore_nodes(
        rules: RuleSet,
        names: &[String],
        nodes: impl IntoIterator<Item = (String, NodeHealth)>,
    ) -> Self {
        let same = names.len() == rules.rules.len()
            && names.iter().zip(&rules.rules).all(|(a, b)| *a == b.name);
        let mut engine = Self::new(rules);
        for (node, mut health) in nodes {
            if !same {
                health.rules.clear();
                health.escalated.clear();
            }
            health.xid_held.sort_by_key(|(g, _)| *g);
            if !health.is_empty() {
                engine.nodes.insert(node, health);
            }
        }
        engine
    }

    /// An engine with nothing seen yet.
    pub fn new(rules: RuleSet) -> Self {
        Self {
            rules,
            nodes: BTreeMap::new(),
            touched: BTreeSet::new(),
        }
    }

    /// The names of its rules, in order: what the rule indices of a [`NodeHealth`] refer to.
    pub fn rule_names(&self) -> Vec<String> {
        self.rules.rules.iter().map(|r| r.name.clone()).collect()
    }

    /// The nodes it knows anything of, in order.
    pub fn node_names(&self) -> impl Iterator<Item = String> + '_ {
        self.nodes.keys().cloned()
    }

    /// What it knows of `node` (`None`: nothing, not even a heartbeat).
    pub fn node(&self, node: &str) -> Option<&NodeHealth> {
        self.nodes.get(node)
    }

    /// The nodes whose [`NodeHealth`] changed since the last call, forgotten as they are
    /// returned.
    pub fn take_touched(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.touched)
    }

    /// `node`'s health, to change: it counts as touched.
    fn node_mut(&mut self, node: &str) -> &mut NodeHealth {
        if !self.touched.contains(node) {
            self.touched.insert(node.to_owned());
        }
        if !self.nodes.contains_key(node) {
            self.nodes.insert(node.to_owned(), NodeHealth::default());
        }
        self.nodes.get_mut(node).expect("inserted above")
    }

    /// Drops `node`'s entry if nothing is left in it.
    fn tidy(&mut self, node: &str) {
        if self.nodes.get(node).is_some_and(NodeHealth::is_empty) {
            self.nodes.remove(node);
        }
    }

    fn operator(&self, node: &str) -> bool {
        self.nodes.get(node).is_some_and(|h| h.operator)
    }

    fn rule_state(&self, idx: usize, node: &str, gpu: Option<u32>) -> Option<State> {
        self.nodes.get(node).and_then(|h| h.rule(idx, gpu))
    }

    /// Sets (or removes) a rule's state on `node`, touching the node only if it changed.
    fn set_rule(&mut self, idx: usize, node: &str, gpu: Option<u32>, state: Option<State>) {
        if self.rule_state(idx, node, gpu) == state {
            return;
        }
        self.node_mut(node).set_rule(idx, gpu, state);
        self.tidy(node);
    }

    /// An operator cordoned (`true`) or uncordoned `node`: while cordoned, remediation takes
    /// no action of its own there (its verdicts become alerts) and returns nothing to service.
    pub fn operator_cordon(&mut self, node: &str, cordoned: bool) {
        if self.operator(node) != cordoned {
            self.node_mut(node).operator = cordoned;
            self.tidy(node);
        }
    }

    /// Weighs one reading; the verdicts it decides.
    pub fn observe(&mut self, r: &Reading) -> Vec<Verdict> {
        let mut out = Vec::new();
        self.xid_return(r.at, Some(&r.node), &mut out);
        if let Signal::Xid(code) = r.signal {
            self.xid(r, code, &mut out);
            return out;
        }
        if r.signal == Signal::Heartbeat {
            self.node_mut(&r.node).heartbeat = Some(r.at);
        }
        // A node no rule holds any state of, the common case: a healthy reading changes
        // nothing there, so it is not stepped through each rule.
        let mut quiet = self.quiet(&r.node);
        for idx in 0..self.rules.rules.len() {
            let rule = &self.rules.rules[idx];
            let (breach, value) = if rule.kind == RuleKind::HeartbeatLost {
                if r.signal != Signal::Heartbeat {
                    continue;
                }
                (false, 0.0)
            } else {
                let Some(value) = rule.kind.measure(&r.signal) else {
                    continue;
                };
                (rule.kind.breaches(value, rule.threshold), value)
            };
            if quiet && !breach {
                continue;
            }
            let gpu = if rule.kind == RuleKind::HeartbeatLost {
                None
            } else {
                r.gpu
            };
            self.step(idx, &r.node, gpu, breach, value, r.at, &mut out);
            quiet = self.quiet(&r.node);
        }
        out
    }

    /// Whether no rule holds any state of `node` (a healthy reading there steps nothing: no
    /// state to move, nothing escalated to clear).
    fn quiet(&self, node: &str) -> bool {
        self.nodes
            .get(node)
            .is_none_or(|h| h.rules.is_empty() && h.escalated.is_empty())
    }

    /// Lets time pass to `now` with no reading: nodes silent for a heartbeat rule's hold-down
    /// lose their heartbeat; what an XID took out returns once its healthy spell is over.
    pub fn tick(&mut self, now: Millis) -> Vec<Verdict> {
        let mut out = Vec::new();
        self.xid_return(now, None, &mut out);
        for idx in 0..self.rules.rules.len() {
            let rule = &self.rules.rules[idx];
            if rule.kind != RuleKind::HeartbeatLost {
                continue;
            }
            let hold = rule.hold_down;
            let silent: Vec<(String, Millis)> = self
                .nodes
                .iter()
                .filter_map(|(n, h)| Some((n, now.saturating_sub(h.heartbeat?))))
                .filter(|(_, silence)| *silence >= hold)
                .map(|(n, silence)| (n.clone(), silence))
                .collect();
            for (node, silence) in silent {
                if let Some(State::Firing { .. }) = self.rule_state(idx, &node, None) {
                    // Silent again while recovering: the healthy spell starts over.
                    let firing = State::Firing {
                        healthy_since: None,
                    };
                    self.set_rule(idx, &node, None, Some(firing));
                } else {
                    let breaching = State::Breaching {
                        since: now - silence,
                    };
                    self.set_rule(idx, &node, None, Some(breaching));
                    self.step(idx, &node, None, true, silence as f64, now, &mut out);
                }
            }
        }
        out
    }

    /// One XID on `r`'s GPU: its class's remedy, at once. Capacity already out because of an
    /// XID is not taken again; the new XID restarts its healthy spell.
    fn xid(&mut self, r: &Reading, code: u64, out: &mut Vec<Verdict>) {
        for gpu in [r.gpu, None] {
            if self
                .nodes
                .get(&r.node)
                .and_then(|h| h.xid_hold(gpu))
                .is_some()
            {
                let health = self.node_mut(&r.node);
                if let Some((_, hold)) = health.xid_held.iter_mut().find(|(g, _)| *g == gpu) {
                    hold.last_at = r.at;
                    hold.last_code = code;
                }
            }
        }
        let remedy = xid::remedy(code);
        let mut v = Verdict {
            rule: XID_RULE.to_owned(),
            node: r.node.clone(),
            gpu: if remedy.action.takes_node() {
                None
            } else {
                r.gpu
            },
            action: remedy.action,
            change: Change::Fire,
            value: code as f64,
            since: r.at,
            at: r.at,
            note: None,
            audience: remedy.audience,
            request: remedy.request,
            xid: Some(code),
        };
        if xid::class(code).is_none() {
            v.note = Some(format!(
                "XID {code} is not in the catalog table: alert only"
            ));
        } else if v.action == Action::GpuOutOfService && v.gpu.is_none() {
            // Which GPU to take is unknown: taking none is the safe guess.
            v.note = Some(format!(
                "XID {code} named no GPU: {:?} not taken, alert only",
                v.action
            ));
            v.action = Action::Alert;
            v.request = None;
        }
        if v.action == Action::Alert {
            out.push(v);
            return;
        }
        if self
            .nodes
            .get(&v.node)
            .and_then(|h| h.xid_hold(v.gpu))
            .is_some()
        {
            return;
        }
        self.hold_back(&mut v);
        // Held back by an operator's cordon: nothing was taken, so nothing is to come back.
        if v.action != Action::Alert {
            let hold = XidHold {
                action: v.action,
                last_at: r.at,
                last_code: code,
            };
            let held = &mut self.node_mut(&v.node).xid_held;
            held.push((v.gpu, hold));
            held.sort_by_key(|(g, _)| *g);
        }
        out.push(v);
    }

    /// Returns to service what an XID took out, where `clear_after` has passed with no further
    /// XID (only on `node`, if given) — but nothing on a node an operator holds.
    fn xid_return(&mut self, now: Millis, node: Option<&str>, out: &mut Vec<Verdict>) {
        let clear = self.rules.xid.clear_after;
        let due = |n: &String, h: &NodeHealth| -> Vec<(XidKey, XidHold)> {
            if h.operator {
                return Vec::new();
            }
            h.xid_held
                .iter()
                .filter(|(_, hold)| now.saturating_sub(hold.last_at) >= clear)
                .map(|(g, hold)| ((n.clone(), *g), *hold))
                .collect()
        };
        let due: Vec<(XidKey, XidHold)> = match node {
            Some(node) => self
                .nodes
                .get_key_value(node)
                .map(|(n, h)| due(n, h))
                .unwrap_or_default(),
            None => self.nodes.iter().flat_map(|(n, h)| due(n, h)).collect(),
        };
        for ((node, gpu), hold) in due {
            self.node_mut(&node).xid_held.retain(|(g, _)| *g != gpu);
            self.tidy(&node);
            out.push(Verdict {
                rule: XID_RULE.to_owned(),
                node,
                gpu,
                action: hold.action,
                change: Change::Clear,
                value: hold.last_code as f64,
                since: hold.last_at,
                at: now,
                note: None,
                audience: Audience::Operators,
                request: None,
                xid: Some(hold.last_code),
            });
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn step(
        &mut self,
        idx: usize,
        node: &str,
        gpu: Option<u32>,
        breach: bool,
        value: f64,
        at: Millis,
        out: &mut Vec<Verdict>,
    ) {
        let rule = &self.rules.rules[idx];
        let (hold, clear) = (rule.hold_down, rule.clear_after);
        let next = match (self.rule_state(idx, node, gpu), breach) {
            (None, false) => None,
            (None, true) if hold == 0 => {
                out.push(self.verdict(idx, node, gpu, Change::Fire, value, at, at));
                Some(State::Firing {
                    healthy_since: None,
                })
            }
            (None, true) => Some(State::Breaching { since: at }),
            (Some(State::Breaching { since }), true) if at.saturating_sub(since) >= hold => {
                out.push(self.verdict(idx, node, gpu, Change::Fire, value, since, at));
                Some(State::Firing {
                    healthy_since: None,
                })
            }
            (Some(s @ State::Breaching { .. }), true) => Some(s),
            // A spike: over before its hold-down.
            (Some(State::Breaching { .. }), false) => None,
            (Some(State::Firing { .. }), true) => Some(State::Firing {
                healthy_since: None,
            }),
            (Some(State::Firing { healthy_since }), false) => {
                let since = healthy_since.unwrap_or(at);
                if at.saturating_sub(since) >= clear && !self.operator(node) {
                    out.push(self.verdict(idx, node, gpu, Change::Clear, value, since, at));
                    None
                } else {
                    Some(State::Firing {
                        healthy_since: Some(since),
                    })
                }
            }
        };
        self.set_rule(idx, node, gpu, next);
        if gpu.is_some() {
            self.escalate(idx, node, value, at, out);
        }
    }

    /// Several GPUs of `node` firing rule `idx` at once: the node's problem.
    fn escalate(&mut self, idx: usize, node: &str, value: f64, at: Millis, out: &mut Vec<Verdict>) {
        let Some(needed) = self.rules.rules[idx].node_when_gpus else {
            return;
        };
        let (firing, escalated, operator) = match self.nodes.get(node) {
            Some(h) => (
                h.rules
                    .iter()
                    .filter(|(i, g, s)| {
                        *i == idx && g.is_some() && matches!(s, State::Firing { .. })
                    })
                    .count() as u32,
                h.escalated.contains(&idx),
                h.operator,
            ),
            None => (0, false, false),
        };
        if firing >= needed && !escalated {
            self.node_mut(node).escalated.push(idx);
            let mut v = self.verdict(idx, node, None, Change::Fire, value, at, at);
            v.action = self.rules.rules[idx].node_action;
            self.hold_back(&mut v);
            out.push(v);
        } else if firing < needed && escalated && !operator {
            self.node_mut(node).escalated.retain(|i| *i != idx);
            self.tidy(node);
            let mut v = self.verdict(idx, node, None, Change::Clear, value, at, at);
            v.action = self.rules.rules[idx].node_action;
            out.push(v);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn verdict(
        &self,
        idx: usize,
        node: &str,
        gpu: Option<u32>,
        change: Change,
        value: f64,
        since: Millis,
        at: Millis,
    ) -> Verdict {
        let rule = &self.rules.rules[idx];
        let mut v = Verdict {
            rule: rule.name.clone(),
            node: node.to_owned(),
            gpu,
            action: rule.action,
            change,
            value,
            since,
            at,
            note: None,
            audience: Audience::Operators,
            request: None,
            xid: None,
        };
        if change == Change::Fire {
            self.hold_back(&mut v);
        }
        v
    }

    /// An operator's cordon is theirs: on such a node, remediation only alerts (and asks no
    /// actuator for anything).
    fn hold_back(&self, v: &mut Verdict) {
        if v.action != Action::Alert && self.operator(&v.node) {
            let request = v
                .request
                .take()
                .map_or(String::new(), |r| format!(" nor {r:?} asked for"));
            v.note = Some(format!(
                "node {} is cordoned by an operator: {:?} not taken{request}, alert only",
                v.node, v.action
            ));
            v.action = Action::Alert;
        }
    }
}

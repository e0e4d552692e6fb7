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

/// The rules' state over every node and GPU seen.
#[derive(Debug, Clone)]
pub struct Engine {
    rules: RuleSet,
    state: BTreeMap<Key, State>,
    /// Per node, its last heartbeat.
    heartbeats: BTreeMap<String, Millis>,
    /// (rule, node) escalated from GPUs to the node.
    escalated: BTreeSet<(usize, String)>,
    /// Nodes an operator cordoned: remediation leaves them alone.
    operator: BTreeSet<String>,
    /// GPUs and nodes out of service because of an XID.
    xid_held: BTreeMap<XidKey, XidHold>,
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
    /// What it has seen, to store.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            rules: self.rules.rules.iter().map(|r| r.name.clone()).collect(),
            state: self.state.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            heartbeats: self
                .heartbeats
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
            escalated: self.escalated.iter().cloned().collect(),
            operator: self.operator.iter().cloned().collect(),
            xid_held: self.xid_held.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        }
    }

    /// An engine under `rules` that has seen what `snapshot` says. Rule states are kept only
    /// if the rules are the same ones, in the same order; otherwise they start over (the
    /// heartbeats, operators' cordons and XID holds are kept either way).
    pub fn restore(rules: RuleSet, snapshot: Snapshot) -> Self {
        let same = snapshot.rules.len() == rules.rules.len()
            && snapshot
                .rules
                .iter()
                .zip(&rules.rules)
                .all(|(a, b)| *a == b.name);
        let mut engine = Self::new(rules);
        if same {
            engine.state = snapshot.state.into_iter().collect();
            engine.escalated = snapshot.escalated.into_iter().collect();
        }
        engine.heartbeats = snapshot.heartbeats.into_iter().collect();
        engine.operator = snapshot.operator.into_iter().collect();
        engine.xid_held = snapshot.xid_held.into_iter().collect();
        engine
    }

    /// An engine with nothing seen yet.
    pub fn new(rules: RuleSet) -> Self {
        Self {
            rules,
            state: BTreeMap::new(),
            heartbeats: BTreeMap::new(),
            escalated: BTreeSet::new(),
            operator: BTreeSet::new(),
            xid_held: BTreeMap::new(),
        }
    }

    /// An operator cordoned (`true`) or uncordoned `node`: while cordoned, remediation takes
    /// no action of its own there (its verdicts become alerts) and returns nothing to service.
    pub fn operator_cordon(&mut self, node: &str, cordoned: bool) {
        if cordoned {
            self.operator.insert(node.to_owned());
        } else {
            self.operator.remove(node);
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
            self.heartbeats.insert(r.node.clone(), r.at);
        }
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
            let gpu = if rule.kind == RuleKind::HeartbeatLost {
                None
            } else {
                r.gpu
            };
            self.step(idx, &r.node, gpu, breach, value, r.at, &mut out);
        }
        out
    }

    /// Lets time pass to `now` with no reading: nodes silent for a heartbeat rule's hold-down
    /// lose their heartbeat; what an XID took out returns once its healthy spell is over.
    pub fn tick(&mut self, now: Millis) -> Vec<Verdict> {
        let mut out = Vec::new();
        self.xid_return(now, None, &mut out);
        let silent: Vec<(String, Millis)> = self
            .heartbeats
            .iter()
            .map(|(n, at)| (n.clone(), now.saturating_sub(*at)))
            .collect();
        for idx in 0..self.rules.rules.len() {
            let rule = &self.rules.rules[idx];
            if rule.kind != RuleKind::HeartbeatLost {
                continue;
            }
            let hold = rule.hold_down;
            for (node, silence) in &silent {
                if *silence < hold {
                    continue;
                }
                let key = (idx, node.clone(), None);
                if let Some(State::Firing { .. }) = self.state.get(&key) {
                    // Silent again while recovering: the healthy spell starts over.
                    self.state.insert(
                        key,
                        State::Firing {
                            healthy_since: None,
                        },
                    );
                } else {
                    self.state.insert(
                        key,
                        State::Breaching {
                            since: now - silence,
                        },
                    );
                    self.step(idx, node, None, true, *silence as f64, now, &mut out);
                }
            }
        }
        out
    }

    /// One XID on `r`'s GPU: its class's remedy, at once. Capacity already out because of an
    /// XID is not taken again; the new XID restarts its healthy spell.
    fn xid(&mut self, r: &Reading, code: u64, out: &mut Vec<Verdict>) {
        for gpu in [r.gpu, None] {
            if let Some(hold) = self.xid_held.get_mut(&(r.node.clone(), gpu)) {
                hold.last_at = r.at;
                hold.last_code = code;
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
        let key = (v.node.clone(), v.gpu);
        if self.xid_held.contains_key(&key) {
            return;
        }
        self.hold_back(&mut v);
        // Held back by an operator's cordon: nothing was taken, so nothing is to come back.
        if v.action != Action::Alert {
            self.xid_held.insert(
                key,
                XidHold {
                    action: v.action,
                    last_at: r.at,
                    last_code: code,
                },
            );
        }
        out.push(v);
    }

    /// Returns to service what an XID took out, where `clear_after` has passed with no further
    /// XID (only on `node`, if given) — but nothing on a node an operator holds.
    fn xid_return(&mut self, now: Millis, node: Option<&str>, out: &mut Vec<Verdict>) {
        let clear = self.rules.xid.clear_after;
        let due: Vec<(XidKey, XidHold)> = self
            .xid_held
            .iter()
            .filter(|((n, _), hold)| {
                node.is_none_or(|want| want == n)
                    && now.saturating_sub(hold.last_at) >= clear
                    && !self.operator.contains(n)
            })
            .map(|(k, h)| (k.clone(), *h))
            .collect();
        for ((node, gpu), hold) in due {
            self.xid_held.remove(&(node.clone(), gpu));
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
        let key = (idx, node.to_owned(), gpu);
        let (hold, clear) = (rule.hold_down, rule.clear_after);
        let next = match (self.state.get(&key).copied(), breach) {
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
                if at.saturating_sub(since) >= clear && !self.operator.contains(node) {
                    out.push(self.verdict(idx, node, gpu, Change::Clear, value, since, at));
                    None
                } else {
                    Some(State::Firing {
                        healthy_since: Some(since),
                    })
                }
            }
        };
        match next {
            Some(s) => self.state.insert(key, s),
            None => self.state.remove(&key),
        };
        if gpu.is_some() {
            self.escalate(idx, node, value, at, out);
        }
    }

    /// Several GPUs of `node` firing rule `idx` at once: the node's problem.
    fn escalate(&mut self, idx: usize, node: &str, value: f64, at: Millis, out: &mut Vec<Verdict>) {
        let Some(needed) = self.rules.rules[idx].node_when_gpus else {
            return;
        };
        let firing = self
            .state
            .iter()
            .filter(|((i, n, g), s)| {
                *i == idx && n == node && g.is_some() && matches!(s, State::Firing { .. })
            })
            .count() as u32;
        let key = (idx, node.to_owned());
        let escalated = self.escalated.contains(&key);
        if firing >= needed && !escalated {
            self.escalated.insert(key);
            let mut v = self.verdict(idx, node, None, Change::Fire, value, at, at);
            v.action = self.rules.rules[idx].node_action;
            self.hold_back(&mut v);
            out.push(v);
        } else if firing < needed && escalated && !self.operator.contains(node) {
            self.escalated.remove(&key);
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
        if v.action != Action::Alert && self.operator.contains(&v.node) {
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

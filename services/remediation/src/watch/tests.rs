use serde_json::json;

use super::*;

const S: Millis = 1_000;

/// Samples of `gpus` GPUs on `node`, each at `temps[i]` °C (GPUs past the list at 60 °C);
/// GPU 0 runs lease 7 of team `vision`.
fn sampled(node: &str, gpus: u32, temps: &[u32]) -> GpusSampled {
    let samples: Vec<serde_json::Value> = (0..gpus)
        .map(|i| {
            json!({
                "index": i, "uuid": format!("GPU-{node}-{i}"), "utilization_pct": 90,
                "memory_used_mib": 1000, "memory_total_mib": 80_000,
                "temperature_c": temps.get(i as usize).copied().unwrap_or(60),
                "power_mw": 300_000, "power_limit_mw": 700_000, "ecc_uncorrected": 0
            })
        })
        .collect();
    serde_json::from_value(json!({
        "node": node,
        "samples": samples,
        "held": [{"index": 0, "lease": 7, "workload": "train-1", "task": "train",
                  "team": "vision", "milli": 1000}]
    }))
    .unwrap()
}

fn watch(nodes: u32) -> Watch {
    let mut w = Watch::new(RuleSet::default(), BreakerPolicy::default());
    for i in 1..=nodes {
        w.registered(&format!("n{i}"));
    }
    w
}

/// `(node, gpu, action)` of each action.
fn brief(actions: &[ActionTaken]) -> Vec<(String, Option<u32>, Action)> {
    actions
        .iter()
        .map(|a| (a.node.clone(), a.gpu, a.action))
        .collect()
}

/// Feeds `n1` the same samples every 5 s from `from` to `to` (inclusive); the actions.
fn feed(w: &mut Watch, node: &str, temps: &[u32], from: Millis, to: Millis) -> Vec<ActionTaken> {
    let mut out = Vec::new();
    let mut at = from;
    while at <= to {
        out.extend(w.sampled(&sampled(node, 8, temps), at));
        at += 5 * S;
    }
    out
}

#[test]
fn a_hot_node_is_drained_once_with_its_evidence_and_runs_and_returns_after_a_healthy_spell() {
    let mut w = watch(10);
    // Two GPUs within 3 °C of the 90 °C slowdown: the node's problem (cooling), not a GPU's.
    let hot = feed(&mut w, "n1", &[89, 88], 0, 30 * S);
    let drains: Vec<&ActionTaken> = hot.iter().filter(|a| a.action == Action::Drain).collect();
    assert_eq!(drains.len(), 1, "{:?}", brief(&hot));
    let drain = drains[0];
    assert_eq!(drain.rule, "overheat");
    assert_eq!(drain.gpu, None);
    assert_eq!(drain.tasks.len(), 1);
    assert_eq!(drain.tasks[0].lease, allot_sched::LeaseId(7));
    assert_eq!(drain.evidence[0].signal, "thermal_margin_c");
    assert_eq!(drain.evidence[0].threshold, Some(3.0));
    assert!(drain.reason.contains("overheat"), "{}", drain.reason);
    // Cool again: nothing until the rule's five healthy minutes have passed, then one return.
    let cool = feed(&mut w, "n1", &[], 35 * S, 35 * S + 4 * 60 * S);
    assert!(
        !cool.iter().any(|a| a.action == Action::ReturnToService),
        "{:?}",
        brief(&cool)
    );
    let back = feed(&mut w, "n1", &[], 35 * S + 5 * 60 * S, 35 * S + 6 * 60 * S);
    assert_eq!(
        back.iter()
            .filter(|a| a.action == Action::ReturnToService)
            .count(),
        1,
        "{:?}",
        brief(&back)
    );
    assert!(w.held().is_empty());
}

#[test]
fn one_hot_gpu_goes_out_of_service_alone_and_a_single_spike_does_nothing() {
    let mut w = watch(10);
    let spike = w.sampled(&sampled("n1", 8, &[95]), 0);
    let after = w.sampled(&sampled("n1", 8, &[]), 5 * S);
    assert!(spike.is_empty() && after.is_empty(), "{spike:?} {after:?}");
    let hot = feed(&mut w, "n1", &[95], 10 * S, 40 * S);
    assert_eq!(
        brief(&hot),
        [("n1".to_owned(), Some(0), Action::GpuOutOfService)]
    );
    assert!(w.held().is_empty(), "the node itself is not held");
}

#[test]
fn past_the_circuit_breaker_node_actions_become_alerts_and_their_clearing_returns_nothing() {
    // Ten nodes, a tenth per window: one node may be taken; three overheat at once.
    let mut w = watch(10);
    let mut actions = Vec::new();
    for node in ["n1", "n2", "n3"] {
        actions.extend(feed(&mut w, node, &[89, 88], 0, 30 * S));
    }
    let drained: Vec<String> = actions
        .iter()
        .filter(|a| a.action == Action::Drain)
        .map(|a| a.node.clone())
        .collect();
    assert_eq!(drained, ["n1"]);
    let held_back: Vec<&ActionTaken> = actions
        .iter()
        .filter(|a| {
            a.action == Action::Alert
                && a.downgraded
                    .as_deref()
                    .is_some_and(|d| d.contains("circuit breaker"))
        })
        .collect();
    assert_eq!(held_back.len(), 2, "{:?}", brief(&actions));
    let mut back = Vec::new();
    for node in ["n1", "n2", "n3"] {
        back.extend(feed(&mut w, node, &[], 35 * S, 35 * S + 6 * 60 * S));
    }
    let returned: Vec<String> = back
        .iter()
        .filter(|a| a.action == Action::ReturnToService)
        .map(|a| a.node.clone())
        .collect();
    assert_eq!(returned, ["n1"]);
}

#[test]
fn an_operators_cordon_is_kept_remediation_only_alerts_there() {
    let mut w = watch(10);
    w.operator("n1", true);
    let hot = feed(&mut w, "n1", &[89, 88], 0, 30 * S);
    assert!(!hot.is_empty());
    assert!(
        hot.iter().all(|a| a.action == Action::Alert),
        "{:?}",
        brief(&hot)
    );
    assert!(w.held().is_empty());
    let cool = feed(&mut w, "n1", &[], 35 * S, 35 * S + 6 * 60 * S);
    assert!(
        !cool.iter().any(|a| a.action == Action::ReturnToService),
        "remediation never lifts an operator's cordon: {:?}",
        brief(&cool)
    );
}

#[test]
fn a_restored_watch_goes_on_where_the_stored_one_stopped() {
    let mut w = watch(10);
    // The breach began before the restart: the first reading after it, 5 s in, fires.
    let before = feed(&mut w, "n1", &[89, 88], 0, 0);
    assert!(before.is_empty());
    let stored = serde_json::to_string(&w.state()).unwrap();
    let mut restored = Watch::restore(
        RuleSet::default(),
        BreakerPolicy::default(),
        serde_json::from_str(&stored).unwrap(),
    );
    let after = feed(&mut restored, "n1", &[89, 88], 5 * S, 5 * S);
    assert_eq!(
        after.iter().filter(|a| a.action == Action::Drain).count(),
        1,
        "{:?}",
        brief(&after)
    );
    // And once only.
    let later = feed(&mut restored, "n1", &[89, 88], 10 * S, 30 * S);
    assert!(
        !later.iter().any(|a| a.action == Action::Drain),
        "{:?}",
        brief(&later)
    );
}

#[test]
fn a_silent_node_is_drained_and_returns_only_after_beating_again_for_a_while() {
    let mut w = watch(10);
    assert!(w.heartbeat("n1", 0).is_empty());
    assert!(w.tick(20 * S).is_empty());
    let lost = w.tick(31 * S);
    assert_eq!(brief(&lost), [("n1".to_owned(), None, Action::Drain)]);
    assert_eq!(lost[0].rule, "heartbeat-lost");
    // Beating again: not back until two healthy minutes have passed.
    let mut back = Vec::new();
    for s in (40..=200).step_by(2) {
        back.extend(w.heartbeat("n1", s * S));
        back.extend(w.tick(s * S + 1));
    }
    let returned: Vec<Millis> = back
        .iter()
        .filter(|a| a.action == Action::ReturnToService)
        .map(|a| millis(a.evidence[0].at))
        .collect();
    assert_eq!(returned.len(), 1, "{:?}", brief(&back));
    assert!(returned[0] >= 40 * S + 120 * S, "{returned:?}");
}

/// `n1`'s samples with XID `code` on GPU `gpu` (GPU 0 runs team vision's lease 7).
fn with_xid(gpu: u32, code: u64) -> GpusSampled {
    let mut s = sampled("n1", 8, &[]);
    s.samples[gpu as usize].xids = vec![code];
    s
}

#[test]
fn xids_by_meaning_an_application_fault_alerts_the_team_a_reset_class_takes_one_gpu_79_the_node() {
    let mut w = watch(10);
    let app = w.sampled(&with_xid(0, 13), 0);
    assert_eq!(brief(&app), [("n1".to_owned(), Some(0), Action::Alert)]);
    assert_eq!(
        app[0].team.as_deref(),
        Some("vision"),
        "the task's team hears of it"
    );

    let reset = w.sampled(&with_xid(2, 95), 5 * S);
    assert_eq!(
        brief(&reset),
        [
            ("n1".to_owned(), Some(2), Action::GpuOutOfService),
            ("n1".to_owned(), Some(2), Action::ResetRequest)
        ]
    );
    assert!(w.held().is_empty(), "one GPU, not the node");

    let off_the_bus = w.sampled(&with_xid(1, 79), 10 * S);
    assert_eq!(
        brief(&off_the_bus),
        [
            ("n1".to_owned(), None, Action::Drain),
            ("n1".to_owned(), None, Action::RebootRequest)
        ]
    );
    assert_eq!(off_the_bus[0].evidence[0].signal, "xid");
    assert_eq!(off_the_bus[0].evidence[0].value, 79.0);
}

/// `n1`'s four GPUs at `utils`, held by leases 7 … 10 (lease 10 only from `late_from` on);
/// lease 9 opted out of idle reclaim.
fn idle_sample(utils: [u8; 4], late: bool) -> GpusSampled {
    let samples: Vec<serde_json::Value> = (0..4)
        .map(|i| {
            json!({"index": i, "uuid": format!("GPU-n1-{i}"), "utilization_pct": utils[i],
                   "memory_used_mib": 1000, "memory_total_mib": 80_000, "temperature_c": 50})
        })
        .collect();
    let mut held = vec![
        json!({"index": 0, "lease": 7, "workload": "nb-1", "task": "notebook", "team": "vision", "milli": 1000}),
        json!({"index": 1, "lease": 8, "workload": "train-1", "task": "train", "team": "vision", "milli": 1000}),
        json!({"index": 2, "lease": 9, "workload": "debug-1", "task": "debug", "team": "vision", "milli": 1000, "no_idle_reclaim": true}),
    ];
    if late {
        held.push(json!({"index": 3, "lease": 10, "workload": "nb-2", "task": "notebook", "team": "vision", "milli": 1000}));
    }
    serde_json::from_value(json!({"node": "n1", "samples": samples, "held": held})).unwrap()
}

#[test]
fn idle_reclaim_warns_then_frees_an_idle_grant_and_leaves_a_busy_an_opted_out_and_a_warming_one() {
    let rules = RuleSet {
        idle: Some(allot_health::IdlePolicy {
            below: 0.01,
            window: 30 * S,
            warm_up: 10 * S,
            notice: 10 * S,
        }),
        ..RuleSet::default()
    };
    let mut w = Watch::new(rules, BreakerPolicy::default());
    w.registered("n1");
    let mut got = Vec::new();
    for t in (0..=55).step_by(5) {
        // Lease 10 starts at 40 s: still warming up (and not idle long enough) at 55 s.
        let sample = idle_sample([0, 80, 0, 0], t >= 40);
        for a in w.sampled(&sample, t * S) {
            got.push((a.action, a.tasks[0].lease.0, millis(a.evidence[0].at) / S));
        }
    }
    assert_eq!(
        got,
        [(Action::Alert, 7, 20), (Action::IdleReclaim, 7, 30)],
        "told 10 s ahead, reclaimed after 30 idle seconds; only lease 7"
    );
}

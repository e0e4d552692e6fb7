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
    let stored = serde_json::to_string(&w.stored()).unwrap();
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

/// The built-in rules with idle reclaim under 1% for `window`, after `warm_up`, told `notice`
/// ahead.
fn idle_rules(window: Millis, warm_up: Millis, notice: Millis) -> RuleSet {
    RuleSet {
        idle: Some(allot_health::IdlePolicy {
            below: 0.01,
            window,
            warm_up,
            notice,
        }),
        ..RuleSet::default()
    }
}

#[test]
fn idle_reclaim_warns_then_frees_an_idle_grant_and_leaves_a_busy_an_opted_out_and_a_warming_one() {
    let rules = idle_rules(30 * S, 10 * S, 10 * S);
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

/// A database with remediation's tables, in memory.
fn database() -> allot_store::rusqlite::Connection {
    allot_store::open_in_memory(crate::store::MIGRATIONS).unwrap()
}

/// Stores what `w` changed, as the service's commit does.
fn commit(conn: &allot_store::rusqlite::Connection, w: &mut Watch, last_pool: &mut Option<String>) {
    let tx = conn.unchecked_transaction().unwrap();
    crate::store::save(&tx, &w.take_changes(), last_pool).unwrap();
    tx.commit().unwrap();
}

/// A breaker that lets every node be taken out.
const ALL_NODES: BreakerPolicy = BreakerPolicy {
    share: 1.0,
    window: 60_000,
};

/// The watch `conn` holds, under `rules` (and [`ALL_NODES`], if `all`).
fn reloaded(conn: &allot_store::rusqlite::Connection, rules: &RuleSet, all: bool) -> Watch {
    let policy = if all {
        ALL_NODES
    } else {
        BreakerPolicy::default()
    };
    match crate::store::load(conn).unwrap().unwrap() {
        crate::store::Loaded::Rows(stored) => Watch::restore(rules.clone(), policy, stored),
        crate::store::Loaded::Whole(_) => panic!("stored whole"),
    }
}

fn as_json(w: &Watch) -> serde_json::Value {
    serde_json::to_value(w.stored()).unwrap()
}

/// `node`'s GPUs at `temps` °C, GPU `gpu` held by `lease` (none: nothing held), at
/// `util` % busy.
fn node_sample(node: &str, temps: &[u32], lease: Option<u64>, util: u8) -> GpusSampled {
    let mut s = sampled(node, 8, temps);
    for g in &mut s.samples {
        g.utilization_pct = Some(util);
    }
    match lease {
        Some(lease) => s.held[0].lease = allot_sched::LeaseId(lease),
        None => s.held.clear(),
    }
    s
}

#[test]
fn what_each_commit_stores_row_by_row_restores_the_watch_exactly() {
    // Every kind of change: registrations, heartbeats and their loss, a hot node drained and
    // returned, XIDs taking a GPU and a node and giving them back, an operator's cordon,
    // runs that change, idle grants noticed and reclaimed.
    let rules = idle_rules(60 * S, 10 * S, 20 * S);
    let mut w = Watch::new(rules.clone(), ALL_NODES);
    let conn = database();
    let mut last_pool = None;
    let mut actions = Vec::new();
    for n in ["n1", "n2", "n3", "n4"] {
        w.registered(n);
    }
    w.operator("n4", true);
    for t in (0..=900).step_by(5) {
        let at = t * S;
        if !(60..=300).contains(&t) {
            for n in ["n1", "n2", "n3", "n4"] {
                actions.extend(w.heartbeat(n, at));
            }
        } else {
            // n3 falls silent from 60 s to 300 s.
            for n in ["n1", "n2", "n4"] {
                actions.extend(w.heartbeat(n, at));
            }
        }
        let hot: &[u32] = if (20..60).contains(&t) {
            &[89, 88]
        } else {
            &[]
        };
        actions.extend(w.sampled(&node_sample("n1", hot, Some(7), 90), at));
        let mut n2 = node_sample("n2", &[], Some(if t < 400 { 8 } else { 9 }), 0);
        if t == 100 {
            n2.samples[2].xids = vec![95];
        }
        if t == 150 {
            n2.samples[1].xids = vec![79];
        }
        actions.extend(w.sampled(&n2, at));
        let n4 = node_sample("n4", &[89, 88], (t < 200).then_some(11), 50);
        actions.extend(w.sampled(&n4, at));
        actions.extend(w.tick(at + 1));
        commit(&conn, &mut w, &mut last_pool);
        assert_eq!(
            as_json(&reloaded(&conn, &rules, true)),
            as_json(&w),
            "at {t} s"
        );
    }
    let kinds: Vec<Action> = actions.iter().map(|a| a.action).collect();
    for kind in [
        Action::Drain,
        Action::ReturnToService,
        Action::GpuOutOfService,
        Action::GpuReturnToService,
        Action::ResetRequest,
        Action::RebootRequest,
        Action::Alert,
        Action::IdleReclaim,
    ] {
        assert!(kinds.contains(&kind), "{kind:?} never happened: {kinds:?}");
    }
    // And the restored watch decides what the live one does.
    let mut restored = reloaded(&conn, &rules, true);
    let hot = node_sample("n1", &[89, 88], Some(7), 90);
    for t in (905..=960).step_by(5) {
        assert_eq!(
            brief(&restored.sampled(&hot, t * S)),
            brief(&w.sampled(&hot, t * S))
        );
    }
    // Idle reclaim switched off: the grants it watched are forgotten by the next commit.
    let grants = |conn: &allot_store::rusqlite::Connection| -> i64 {
        conn.query_row("SELECT count(*) FROM idle_grant", [], |r| r.get(0))
            .unwrap()
    };
    assert!(grants(&conn) > 0);
    let mut off = reloaded(&conn, &RuleSet::default(), true);
    commit(&conn, &mut off, &mut None);
    assert_eq!(grants(&conn), 0, "grants kept with idle reclaim off");
}

#[test]
fn a_commit_stores_the_nodes_its_batch_changed_not_the_fleet() {
    let mut w = watch(0);
    let nodes: Vec<String> = (0..500).map(|i| format!("n{i}")).collect();
    for n in &nodes {
        w.registered(n);
        w.heartbeat(n, 0);
        w.sampled(&node_sample(n, &[], Some(7), 90), 0);
    }
    assert_eq!(w.take_changes().nodes.len(), 500);
    // A second of healthy samples showing the same runs changes no node.
    for n in &nodes {
        assert!(w.sampled(&node_sample(n, &[], Some(7), 90), S).is_empty());
    }
    assert!(w.take_changes().is_empty());
    // A heartbeat changes its node, a new run its node, a hot GPU its node.
    w.heartbeat("n1", 2 * S);
    w.sampled(&node_sample("n2", &[], Some(8), 90), 2 * S);
    w.sampled(&node_sample("n3", &[89], Some(7), 90), 2 * S);
    let changed: Vec<String> = w.take_changes().nodes.into_iter().map(|(n, _)| n).collect();
    assert_eq!(changed, ["n1", "n2", "n3"]);
}

#[test]
fn a_state_stored_whole_by_an_earlier_version_is_read_and_stored_again_node_by_node() {
    // As versions before 2026-11-26 wrote it: n1's GPUs 0 and 1 over the overheat threshold
    // since 0 s, both nodes beating, lease 7 on n1's GPU 0.
    let whole = json!({
        "engine": {
            "rules": ["overheat", "power-over-limit", "memory-near-full", "ecc-uncorrectable",
                      "row-remap-failure", "nvlink-errors", "heartbeat-lost"],
            "state": [[[0, "n1", 0], {"Breaching": {"since": 0}}],
                      [[0, "n1", 1], {"Breaching": {"since": 0}}]],
            "heartbeats": [["n1", 0], ["n2", 0]],
            "escalated": [],
            "operator": [],
            "xid_held": []
        },
        "breaker": {"max_nodes": 1, "window": 600000, "taken": []},
        "nodes": ["n1", "n2"],
        "runs": {"n1": [[0, {"lease": 7, "workload": "train-1", "task": "train",
                              "team": "vision"}]]},
        "held": {},
        "gpus_out": {}
    });
    let conn = database();
    conn.execute(
        "INSERT INTO state (id, json) VALUES (1, ?1)",
        [whole.to_string()],
    )
    .unwrap();
    let crate::store::Loaded::Whole(state) = crate::store::load(&conn).unwrap().unwrap() else {
        panic!("not read as a whole state");
    };
    let mut w = Watch::restore_whole(RuleSet::default(), BreakerPolicy::default(), *state);
    let mut last_pool = None;
    commit(&conn, &mut w, &mut last_pool);
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM node", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 2);
    let mut again = reloaded(&conn, &RuleSet::default(), false);
    assert_eq!(as_json(&again), as_json(&w));
    // The breach survived both moves: the next hot reading, 5 s in, drains n1.
    let drained = again.sampled(&sampled("n1", 8, &[89, 88]), 5 * S);
    assert_eq!(
        brief(&drained),
        [
            ("n1".to_owned(), Some(0), Action::GpuOutOfService),
            ("n1".to_owned(), Some(1), Action::GpuOutOfService),
            ("n1".to_owned(), None, Action::Drain)
        ],
    );
}

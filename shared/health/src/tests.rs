use super::*;

const S: Millis = 1_000;

fn temp(node: &str, gpu: u32, at: Millis, celsius: f64) -> Reading {
    Reading {
        node: node.into(),
        gpu: Some(gpu),
        at,
        signal: Signal::Temperature {
            celsius,
            slowdown_celsius: 90.0,
        },
    }
}

fn beat(node: &str, at: Millis) -> Reading {
    Reading {
        node: node.into(),
        gpu: None,
        at,
        signal: Signal::Heartbeat,
    }
}

/// `(rule, node, gpu, action, fire?)` of each verdict.
fn brief(v: &[Verdict]) -> Vec<(String, String, Option<u32>, Action, bool)> {
    v.iter()
        .map(|v| {
            (
                v.rule.clone(),
                v.node.clone(),
                v.gpu,
                v.action,
                v.change == Change::Fire,
            )
        })
        .collect()
}

fn run(engine: &mut Engine, readings: &[Reading]) -> Vec<Verdict> {
    readings.iter().flat_map(|r| engine.observe(r)).collect()
}

#[test]
fn a_spike_never_fires_a_sustained_breach_fires_once_and_clears_only_after_a_healthy_spell() {
    let mut e = Engine::new(RuleSet::default());
    // overheat: margin under 3 °C for 5 s. One hot reading, then normal: nothing.
    let spike = run(
        &mut e,
        &[temp("n1", 0, 0, 89.0), temp("n1", 0, 5 * S, 70.0)],
    );
    assert!(spike.is_empty(), "{spike:?}");
    // Hot from 10 s on: fires at the first reading 5 s into the breach, once.
    let hot: Vec<Reading> = (0..=6)
        .map(|i| temp("n1", 0, (10 + 5 * i) * S, 88.5))
        .collect();
    let fired = run(&mut e, &hot);
    assert_eq!(
        brief(&fired),
        [(
            "overheat".into(),
            "n1".into(),
            Some(0),
            Action::GpuOutOfService,
            true
        )]
    );
    assert_eq!((fired[0].since, fired[0].at), (10 * S, 15 * S));
    // Healthy for 4 minutes, one hot reading, then healthy again: the 5-minute spell starts
    // over, so it clears 5 minutes after the hot reading, not after the first healthy one.
    let mut later = vec![temp("n1", 0, 60 * S, 60.0), temp("n1", 0, 300 * S, 60.0)];
    later.push(temp("n1", 0, 310 * S, 89.0));
    later.push(temp("n1", 0, 320 * S, 60.0));
    later.push(temp("n1", 0, 400 * S, 60.0));
    assert!(run(&mut e, &later).is_empty());
    let cleared = run(&mut e, &[temp("n1", 0, 620 * S, 60.0)]);
    assert_eq!(
        brief(&cleared),
        [(
            "overheat".into(),
            "n1".into(),
            Some(0),
            Action::GpuOutOfService,
            false
        )]
    );
}

#[test]
fn one_hot_gpu_is_that_gpus_problem_two_are_the_nodes() {
    let mut e = Engine::new(RuleSet::default());
    let mut readings = Vec::new();
    for t in [0, 10, 20, 30] {
        readings.push(temp("n1", 3, t * S, 89.0));
        readings.push(temp("n2", 0, t * S, 89.0));
        readings.push(temp("n2", 1, t * S, 89.0));
    }
    let got = brief(&run(&mut e, &readings));
    assert_eq!(
        got,
        [
            (
                "overheat".into(),
                "n1".into(),
                Some(3),
                Action::GpuOutOfService,
                true
            ),
            (
                "overheat".into(),
                "n2".into(),
                Some(0),
                Action::GpuOutOfService,
                true
            ),
            (
                "overheat".into(),
                "n2".into(),
                Some(1),
                Action::GpuOutOfService,
                true
            ),
            ("overheat".into(), "n2".into(), None, Action::Drain, true),
        ]
    );
}

#[test]
fn an_operators_cordon_is_kept_remediation_only_alerts_there() {
    let mut e = Engine::new(RuleSet::default());
    e.operator_cordon("n1", true);
    let readings: Vec<Reading> = [0, 10, 20]
        .into_iter()
        .flat_map(|t| [temp("n1", 0, t * S, 89.0), temp("n1", 1, t * S, 89.0)])
        .collect();
    let got = run(&mut e, &readings);
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(got.iter().all(|v| v.action == Action::Alert), "{got:?}");
    assert!(
        got.iter()
            .all(|v| v.note.as_deref().is_some_and(|n| n.contains("operator"))),
        "{got:?}"
    );
    // Healthy long after: nothing is returned to service while the operator holds the node.
    assert!(
        run(
            &mut e,
            &[
                temp("n1", 0, 2_000 * S, 50.0),
                temp("n1", 0, 4_000 * S, 50.0)
            ]
        )
        .is_empty()
    );
}

#[test]
fn a_silent_node_loses_its_heartbeat_and_returns_only_after_beating_for_the_clear_time() {
    let mut e = Engine::new(RuleSet::default());
    e.observe(&beat("n1", 0));
    assert!(e.tick(29 * S).is_empty());
    let lost = e.tick(30 * S);
    assert_eq!(
        brief(&lost),
        [(
            "heartbeat-lost".into(),
            "n1".into(),
            None,
            Action::Drain,
            true
        )]
    );
    assert!(e.tick(60 * S).is_empty(), "fired once");
    // Back: it must beat for 2 minutes; a second silence on the way starts that over.
    let back: Vec<Reading> = (0..=6).map(|i| beat("n1", (100 + 10 * i) * S)).collect();
    assert!(run(&mut e, &back).is_empty());
    assert!(e.tick(200 * S).is_empty());
    let again: Vec<Reading> = (0..=12).map(|i| beat("n1", (200 + 10 * i) * S)).collect();
    let cleared = run(&mut e, &again);
    assert_eq!(
        brief(&cleared),
        [(
            "heartbeat-lost".into(),
            "n1".into(),
            None,
            Action::Drain,
            false
        )]
    );
    assert_eq!(cleared[0].at, 320 * S);
}

#[test]
fn a_rules_file_with_problems_names_every_one() {
    let text = "rules:\n\
        - {name: hot, signal: thermal-margin, for: soon, action: drain}\n\
        - {name: hot, signal: power-over-limit, threshold: .inf, action: alert}\n\
        - {signal: heartbeat-lost, action: cordon, nodeWhenGpus: 0}\n";
    let problems = RuleSet::parse(text).unwrap_err();
    let want = [
        "rules[0] (hot).threshold: missing",
        "rules[0] (hot).for: \"soon\" is not a duration",
        "rules[1] (hot).name: \"hot\" is used by an earlier rule",
        "rules[1] (hot).threshold: inf is not a finite number",
        "rules[2].name: missing",
        "rules[2].for: a lost heartbeat needs the silence it waits for",
        "rules[2].nodeWhenGpus: must be at least 1",
    ];
    assert_eq!(problems.len(), want.len(), "{problems:#?}");
    for (got, want) in problems.iter().zip(want) {
        assert!(got.starts_with(want), "{got:?} vs {want:?}");
    }
    assert!(RuleSet::parse(rules::DEFAULT_RULES).is_ok());
}

#[test]
fn the_breaker_caps_the_nodes_taken_out_in_any_window() {
    // 10% of 40 nodes within 10 minutes: 4.
    let mut b = Breaker::new(0.1, 40, 600 * S);
    let taken: Vec<bool> = (0..6).map(|i| b.admit(i * S)).collect();
    assert_eq!(taken, [true, true, true, true, false, false]);
    // The window slides: the first leaves it at 600 s.
    assert!(!b.admit(599 * S));
    assert!(b.admit(600 * S));
    // A tiny pool still lets one node go.
    assert!(Breaker::new(0.1, 3, 600 * S).admit(0));
}

#[test]
fn idle_reclaim_frees_an_idle_grant_and_leaves_a_busy_an_opted_out_and_a_warming_one() {
    let min = 60 * S;
    // Under 1% for 10 min, 10 min warm-up, notice 2 min ahead.
    let mut w = IdleWatch::new(IdlePolicy::default());
    w.granted(1, 0, false); // idle from minute 11: told at 19, reclaimed at minute 21
    w.granted(2, 0, false); // busy
    w.granted(3, 0, true); // idle, opted out
    w.granted(4, 15 * min, false); // idle, but started at minute 15: warm until 25
    let mut reclaimed = Vec::new();
    for m in 11..=24 {
        for (lease, util) in [(1, 0.0), (2, 0.6), (3, 0.0), (4, 0.0)] {
            let (what, r) = match w.observe(lease, util, m * min) {
                Some(Idle::Notice(r)) => ("notice", r),
                Some(Idle::Reclaim(r)) => ("reclaim", r),
                None => continue,
            };
            reclaimed.push((what, r.lease, r.idle_since / min, r.at / min));
        }
    }
    assert_eq!(reclaimed, [("notice", 1, 11, 19), ("reclaim", 1, 11, 21)]);
    // One busy reading restarts the window (and the notice); a grant is reclaimed once.
    w.granted(5, 0, false);
    let got: Vec<bool> = [
        (11, 0.0),
        (18, 0.5),
        (19, 0.0),
        (28, 0.0),
        (29, 0.0),
        (30, 0.0),
    ]
    .into_iter()
    .map(|(m, u)| w.observe(5, u, m * min).is_some())
    .collect();
    assert_eq!(got, [false, false, false, true, true, false]);
}

fn xid(node: &str, gpu: u32, at: Millis, code: u64) -> Reading {
    Reading {
        node: node.into(),
        gpu: Some(gpu),
        at,
        signal: Signal::Xid(code),
    }
}

/// `(node, gpu, action, audience, request, fire?)` of each XID verdict.
type XidBrief = (String, Option<u32>, Action, Audience, Option<Request>, bool);

fn brief_xid(v: &[Verdict]) -> Vec<XidBrief> {
    v.iter()
        .map(|v| {
            assert_eq!(v.rule, xid::XID_RULE, "{v:?}");
            (
                v.node.clone(),
                v.gpu,
                v.action,
                v.audience,
                v.request,
                v.change == Change::Fire,
            )
        })
        .collect()
}

#[test]
fn an_application_fault_xid_alerts_the_tasks_team_and_touches_nothing() {
    let mut e = Engine::new(RuleSet::default());
    for (at, code) in [(0, 13), (S, 31), (2 * S, 43)] {
        let got = e.observe(&xid("n1", 2, at, code));
        assert_eq!(
            brief_xid(&got),
            [(
                "n1".into(),
                Some(2),
                Action::Alert,
                Audience::Team,
                None,
                true
            )],
            "XID {code}"
        );
        assert_eq!(got[0].xid, Some(code));
    }
    // Nothing was taken, so nothing comes back.
    assert!(e.tick(3_600 * S).is_empty());
}

#[test]
fn a_reset_class_xid_takes_out_its_gpu_alone_and_returns_it_after_a_spell_without_xids() {
    let mut e = Engine::new(RuleSet::default()); // xid: {clearAfter: 10m}
    let min = 60 * S;
    let taken = e.observe(&xid("n1", 3, 0, 95));
    assert_eq!(
        brief_xid(&taken),
        [(
            "n1".into(),
            Some(3),
            Action::GpuOutOfService,
            Audience::Operators,
            Some(Request::ResetGpu),
            true
        )]
    );
    // Out already: a second XID there asks for nothing more but starts the spell over.
    assert!(e.observe(&xid("n1", 3, 4 * min, 95)).is_empty());
    // The node's other GPUs are untouched, and time passing on them does not return GPU 3.
    assert!(e.observe(&temp("n1", 0, 13 * min, 60.0)).is_empty());
    assert!(e.tick(13 * min).is_empty());
    let back = e.tick(14 * min);
    assert_eq!(
        brief_xid(&back),
        [(
            "n1".into(),
            Some(3),
            Action::GpuOutOfService,
            Audience::Operators,
            None,
            false
        )]
    );
    assert_eq!((back[0].since, back[0].xid), (4 * min, Some(95)));
}

#[test]
fn xid_79_drains_the_node_asks_for_a_reboot_once_and_returns_it_after_a_spell_without_xids() {
    let mut e = Engine::new(RuleSet::default());
    let got = run(&mut e, &[xid("n1", 0, 0, 79), xid("n1", 5, S, 79)]);
    assert_eq!(
        brief_xid(&got),
        [(
            "n1".into(),
            None,
            Action::Drain,
            Audience::Operators,
            Some(Request::RebootNode),
            true
        )]
    );
    // The second 79 started the spell over: the node comes back 10 minutes after it.
    let min = 60 * S;
    assert!(e.tick(S + 10 * min - 1).is_empty());
    assert_eq!(
        brief_xid(&e.tick(S + 10 * min)),
        [(
            "n1".into(),
            None,
            Action::Drain,
            Audience::Operators,
            None,
            false
        )]
    );
}

#[test]
fn an_unknown_xid_only_alerts_the_operators() {
    let mut e = Engine::new(RuleSet::default());
    let got = e.observe(&xid("n1", 1, 0, 999));
    assert_eq!(
        brief_xid(&got),
        [(
            "n1".into(),
            Some(1),
            Action::Alert,
            Audience::Operators,
            None,
            true
        )]
    );
    assert!(
        got[0]
            .note
            .as_deref()
            .is_some_and(|n| n.contains("not in the catalog")),
        "{got:?}"
    );
}

#[test]
fn an_operators_cordoned_node_gets_an_alert_for_xid_79_and_no_reboot() {
    let mut e = Engine::new(RuleSet::default());
    e.operator_cordon("n1", true);
    let got = e.observe(&xid("n1", 0, 0, 79));
    assert_eq!(
        brief_xid(&got),
        [(
            "n1".into(),
            None,
            Action::Alert,
            Audience::Operators,
            None,
            true
        )]
    );
    assert!(
        got[0]
            .note
            .as_deref()
            .is_some_and(|n| n.contains("operator")),
        "{got:?}"
    );
    // Nothing was taken: nothing to return once the operator lets go.
    e.operator_cordon("n1", false);
    assert!(e.tick(3_600 * S).is_empty());
}

#[test]
fn the_xid_section_sets_the_healthy_spell_and_its_problems_come_with_the_rest() {
    let ok = RuleSet::parse("rules: []\nxid: {clearAfter: 90s}\n").unwrap();
    assert_eq!(ok.xid.clear_after, 90 * S);
    assert_eq!(
        RuleSet::parse("rules: []\n").unwrap().xid,
        XidPolicy::default()
    );
    let problems = RuleSet::parse(
        "rules:\n  - {name: xid, signal: ecc-uncorrectable, threshold: 0, action: alert}\n\
         xid: {clearAfter: soon}\n",
    )
    .unwrap_err();
    let want = [
        "rules[0] (xid).name: \"xid\" is reserved",
        "xid.clearAfter: \"soon\" is not a duration",
    ];
    assert_eq!(problems.len(), want.len(), "{problems:#?}");
    for (got, want) in problems.iter().zip(want) {
        assert!(got.starts_with(want), "{got:?} vs {want:?}");
    }
}

#[test]
fn the_example_rules_file_is_the_built_in_set() {
    let example = include_str!("../../../examples/health-rules.yaml");
    assert_eq!(RuleSet::parse(example), Ok(RuleSet::default()));
}

#[test]
fn the_idle_section_sets_the_policy_and_reports_every_problem() {
    let rules =
        RuleSet::parse("rules: []\nidle: {below: 5%, window: 30s, warmUp: 1m, notice: 10s}\n")
            .unwrap();
    assert_eq!(
        rules.idle,
        Some(IdlePolicy {
            below: 0.05,
            window: 30 * S,
            warm_up: 60 * S,
            notice: 10 * S,
        })
    );
    assert_eq!(RuleSet::parse("rules: []\n").unwrap().idle, None);
    let problems =
        RuleSet::parse("rules: []\nidle: {below: 150%, window: 0s, notice: soon}\n").unwrap_err();
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(problems[0].starts_with("idle.below"), "{problems:#?}");
    assert!(
        problems.iter().any(|p| p.starts_with("idle.notice")),
        "{problems:#?}"
    );
    assert!(
        problems.iter().any(|p| p.starts_with("idle.window")),
        "{problems:#?}"
    );
}

#[test]
fn only_nodes_whose_health_changed_are_touched_and_a_node_stored_alone_restores_exactly() {
    let mut e = Engine::new(RuleSet::default());
    run(
        &mut e,
        &[beat("n1", 0), beat("n2", 0), temp("n1", 0, 0, 89.0)],
    );
    assert_eq!(
        e.take_touched().into_iter().collect::<Vec<_>>(),
        ["n1", "n2"],
        "a heartbeat and a breach each change a node"
    );
    // Cool readings on a node the rules are quiet about change nothing of it.
    run(&mut e, &[temp("n2", 0, S, 60.0), temp("n2", 1, S, 61.0)]);
    assert!(e.take_touched().is_empty());
    // The breach goes on, unchanged: n1 is not touched either; silence past the hold-down is.
    run(&mut e, &[temp("n1", 0, 2 * S, 89.0)]);
    assert!(e.take_touched().is_empty());
    assert!(e.tick(31 * S).len() == 2, "both nodes went silent");
    assert_eq!(e.take_touched().len(), 2);

    // Stored node by node, restored: the same verdicts from then on.
    let names = e.rule_names();
    let nodes = ["n1", "n2"].map(|n| (n.to_owned(), e.node(n).unwrap().clone()));
    let mut restored = Engine::restore_nodes(RuleSet::default(), &names, nodes);
    assert_eq!(restored.snapshot(), e.snapshot());
    let next = [temp("n1", 0, 32 * S, 89.0), beat("n2", 33 * S)];
    assert_eq!(
        brief(&run(&mut restored, &next)),
        brief(&run(&mut e, &next))
    );
    // Under other rules, only what does not depend on them is kept.
    let other = RuleSet::parse(
        "rules:\n  - {name: hot, signal: thermal-margin, threshold: 3, for: 5s, action: alert}\n",
    )
    .unwrap();
    let n1 = e.node("n1").unwrap().clone();
    let mut moved = Engine::restore_nodes(other, &names, [("n1".to_owned(), n1)]);
    assert!(moved.node("n1").is_some(), "its heartbeat is kept");
    assert!(
        moved.observe(&temp("n1", 0, 40 * S, 89.0)).is_empty(),
        "the breach since 0 s was not kept under rules that are gone"
    );
    assert_eq!(moved.observe(&temp("n1", 0, 45 * S, 89.0)).len(), 1);
}

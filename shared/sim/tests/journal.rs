//! Journals the simulator writes — what `allot sim --journal` saves and `allot replay --verify`
//! audits — keep the journal invariants (no GPU held twice, no task granted twice, every lease
//! ended once) and recompute identically, on small runs of the real traces in `../shared/traces`
//! (skipped with a message when the folder is absent): the Tiresias sample squeezed onto three
//! nodes, so jobs queue and preemptive policies preempt, and the openb pods with their GPU
//! fractions on the GPU nodes they came from.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use allot_sched::journal::{self, Entry, Header, invariants};
use allot_sched::{NodeSpec, policy};
use allot_sim::load::{openb, tiresias};
use allot_sim::scenario::Scenario;
use allot_sim::{Observer, SimConfig, Trace};

fn real_traces(test: &str) -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "skipping {test}: the real traces are not at {} (see shared/traces/README.md)",
            dir.display()
        );
        None
    }
}

fn scenario(name: &str, trace: Trace, nodes: usize) -> Scenario {
    let nodes = trace
        .nodes
        .iter()
        .take(nodes)
        .map(|n| NodeSpec {
            name: n.name.clone(),
            gpus: n.gpus,
            gpu_model: n.model.clone(),
            cpu_milli: n.cpu_milli,
            memory_mib: n.memory_mib,
            ..NodeSpec::default()
        })
        .collect();
    Scenario {
        name: name.into(),
        trace,
        nodes,
        nominal: BTreeMap::new(),
        dag: None,
    }
}

/// Runs `scenario` under `policy` and returns its journal, entry by entry, as the simulator's
/// journal sink hands it out; also how many preemptions the run had.
fn journal_of(scenario: &Scenario, policy: &str) -> (Vec<Entry>, u64) {
    let mut entries = Vec::new();
    let mut sink = |input: &allot_sched::Input,
                    decisions: &[allot_sched::Decision],
                    rejected: Option<&allot_sched::ApplyError>| {
        entries.push(Entry {
            seq: entries.len() as u64 + 1,
            input: input.clone(),
            decisions: decisions.to_vec(),
            rejected: rejected.map(ToString::to_string),
        });
    };
    let mut observer = Observer {
        journal: Some(&mut sink),
        ..Observer::default()
    };
    let result = allot_sim::run_scenario(
        scenario,
        policy::by_name(policy).expect("a known policy"),
        &SimConfig::default(),
        &mut observer,
    )
    .unwrap_or_else(|err| panic!("{}/{policy}: {err}", scenario.name));
    (entries, result.kpis.preemptions)
}

fn assert_journal_sound(scenario: &Scenario, policy: &str) -> u64 {
    let (entries, preemptions) = journal_of(scenario, policy);
    let name = &scenario.name;
    // The allot policy runs on the predictor's predictions, carried in the journalled
    // submissions: the replay below re-decides from them and never runs a model.
    let predicted = entries
        .iter()
        .filter(|e| {
            matches!(&e.input, allot_sched::Input::TaskSubmitted { task, .. }
                if task.predicted_duration.is_some())
        })
        .count();
    let uses_predictor = policy::by_name(policy).is_some_and(|p| p.uses_predictor());
    assert_eq!(
        predicted > 0,
        uses_predictor,
        "{name}/{policy}: {predicted} submissions carry a prediction"
    );
    if let Err(violation) = invariants::check(&entries) {
        panic!("{name}/{policy}: the simulator's journal breaks an invariant: {violation}");
    }
    journal::verify(&Header::new(policy), entries, None, None)
        .unwrap_or_else(|err| panic!("{name}/{policy}: {err}"));
    preemptions
}

#[test]
fn journals_of_the_tiresias_sample_on_three_nodes_keep_the_invariants() {
    let Some(traces) = real_traces("journals_of_the_tiresias_sample") else {
        return;
    };
    let trace = tiresias::load(
        &traces.join("tiresias/60_job.csv"),
        &traces.join("tiresias/cluster_spec.csv"),
    )
    .expect("the Tiresias sample loads");
    let scenario = scenario("tiresias-60 on 3x4", trace, 3);
    let mut preemptions = 0;
    for policy in ["fifo", "fifo-backfill", "tiresias", "kueue", "allot"] {
        preemptions += assert_journal_sound(&scenario, policy);
    }
    assert!(
        preemptions > 0,
        "no policy preempted: the runs did not exercise preemptions"
    );
}

#[test]
fn journals_of_the_openb_pods_with_gpu_fractions_keep_the_invariants() {
    let Some(traces) = real_traces("journals_of_the_openb_pods") else {
        return;
    };
    let mut trace = openb::load(
        &traces.join("openb/pods.csv"),
        &traces.join("openb/nodes.csv"),
    )
    .expect("openb loads");
    // The first 2,000 pods to arrive (of 8,152) keep the test quick.
    trace.jobs.truncate(2_000);
    let nodes = trace.nodes.len();
    let scenario = scenario("openb on its GPU nodes", trace, nodes);
    assert!(
        scenario.trace.jobs.iter().any(|j| j.gpu_milli < 1000),
        "the run shares GPUs"
    );
    for policy in ["fgd", "allot"] {
        assert_journal_sound(&scenario, policy);
    }
}

use allot_events::workload::{ApiVersion, Kind, Metadata, Resources, Task, Workload, WorkloadSpec};

use super::*;

/// `task("train").after(["prep"])`.
fn task(name: &str, after: &[&str]) -> Task {
    Task {
        name: name.into(),
        resources: Resources::default(),
        command: vec!["true".into()],
        image: None,
        after: after.iter().map(|s| (*s).to_owned()).collect(),
        gang: None,
        duration_estimate: None,
        deadline: None,
        max_runtime: None,
        retry: None,
        checkpoint: None,
        idle_reclaim: None,
    }
}

fn workload(tasks: Vec<Task>) -> Workload {
    Workload {
        api_version: ApiVersion::V1,
        kind: Kind::Workload,
        metadata: Metadata {
            name: "w".into(),
            team: "t".into(),
            project: None,
            priority_class: None,
            labels: Default::default(),
        },
        spec: WorkloadSpec { tasks },
    }
}

fn facts(dependents: u32, critical_path_rank: u32) -> DagFacts {
    DagFacts {
        dependents,
        critical_path_rank,
    }
}

#[test]
fn facts_count_transitive_dependents_and_the_longest_chain_to_the_end() {
    struct Case {
        name: &'static str,
        tasks: Vec<Task>,
        want: Vec<(&'static str, DagFacts)>,
    }
    let cases = [
        Case {
            name: "a single task unblocks nothing and ends its own chain",
            tasks: vec![task("solo", &[])],
            want: vec![("solo", facts(0, 1))],
        },
        Case {
            name: "preprocess, a gang of two trainers, then eval: the trainers share one chain",
            tasks: vec![
                task("prep", &[]),
                task("train-0", &["prep"]),
                task("train-1", &["prep"]),
                task("eval", &["train-0", "train-1"]),
            ],
            want: vec![
                ("eval", facts(0, 1)),
                ("prep", facts(3, 3)),
                ("train-0", facts(1, 2)),
                ("train-1", facts(1, 2)),
            ],
        },
        Case {
            name: "a diamond with a long and a short branch: rank follows the long one",
            tasks: vec![
                task("a", &[]),
                task("short", &["a"]),
                task("long-1", &["a"]),
                task("long-2", &["long-1"]),
                task("join", &["short", "long-2"]),
            ],
            want: vec![
                ("a", facts(4, 4)),
                ("join", facts(0, 1)),
                ("long-1", facts(2, 3)),
                ("long-2", facts(1, 2)),
                ("short", facts(1, 2)),
            ],
        },
    ];
    for case in cases {
        let got = Dag::of(&workload(case.tasks)).facts().expect(case.name);
        let want: BTreeMap<String, DagFacts> = case
            .want
            .into_iter()
            .map(|(n, f)| (n.to_owned(), f))
            .collect();
        assert_eq!(got, want, "{}", case.name);
    }
}

#[test]
fn cycles_are_printed_in_run_order_from_the_first_declared_task() {
    let cases: [(&str, Vec<Task>, Vec<&str>); 3] = [
        (
            "three tasks in a ring",
            vec![task("a", &["c"]), task("b", &["a"]), task("c", &["b"])],
            vec!["a -> b -> c -> a"],
        ),
        (
            "a task that waits for itself",
            vec![task("loop", &["loop"]), task("fine", &[])],
            vec!["loop -> loop"],
        ),
        (
            "two separate rings are two cycles",
            vec![
                task("a", &["b"]),
                task("b", &["a"]),
                task("x", &["y"]),
                task("y", &["x"]),
            ],
            vec!["a -> b -> a", "x -> y -> x"],
        ),
    ];
    for (name, tasks, want) in cases {
        let dag = Dag::of(&workload(tasks));
        let got: Vec<String> = dag.cycles().iter().map(|c| c.join(" -> ")).collect();
        assert_eq!(got, want, "{name}");
        assert!(dag.facts().is_none(), "{name}: no facts for a cyclic graph");
    }
}

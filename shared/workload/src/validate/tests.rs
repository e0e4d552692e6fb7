//! What `allot validate` says about specs, problem by problem, exactly as users read it.

use super::*;
use crate::teams::TeamsConfig;

/// A valid spec: CPU preprocess → a gang of two 1-GPU trainers → 1-GPU eval.
const GOOD: &str = r#"
apiVersion: allot/v1
kind: Workload
metadata:
  name: train-eval
  team: vision
  priorityClass: standard
spec:
  tasks:
    - name: prep
      resources: {cpu: "8", memory: 32Gi}
      command: [python, prep.py]
    - name: train-0
      resources: {gpus: 1, gpuModels: [H100], gpuMemory: 40Gi}
      command: [torchrun, train.py]
      after: [prep]
      gang: train
    - name: train-1
      resources: {gpus: 1, gpuModels: [H100], gpuMemory: 40Gi}
      command: [torchrun, train.py]
      after: [prep]
      gang: train
    - name: eval
      resources: {gpuFraction: "0.5"}
      command: [python, eval.py]
      after: [train-0, train-1]
"#;

fn teams() -> TeamsConfig {
    TeamsConfig::from_yaml("teams: [{name: vision}, {name: nlp}]\n").unwrap()
}

fn cluster() -> ClusterShape {
    let mut c = ClusterShape::parse("2x4:H100,1x8:L4").unwrap();
    c.nodes[0].gpu_memory_mib = 81_559;
    c.nodes[0].cpu_milli = 64_000;
    c.nodes[0].memory_mib = 512 * 1024;
    c.nodes[1].gpu_memory_mib = 23_034;
    c
}

fn problems(yaml: &str, format: Format) -> Vec<String> {
    let teams = teams();
    let cluster = cluster();
    let ctx = Context {
        teams: Some(&teams),
        cluster: Some(&cluster),
    };
    match check(yaml, format, ctx) {
        Ok(_) => Vec::new(),
        Err(problems) => problems.iter().map(ToString::to_string).collect(),
    }
}

/// `GOOD` with the first occurrence of `from` replaced by `to`.
fn good_with(from: &str, to: &str) -> String {
    assert!(GOOD.contains(from), "{from:?} is not in the good spec");
    GOOD.replacen(from, to, 1)
}

#[test]
fn the_good_spec_passes_with_its_priority_requests_and_dag_facts() {
    let teams = teams();
    let cluster = cluster();
    let checked = check(
        GOOD,
        Format::Yaml,
        Context {
            teams: Some(&teams),
            cluster: Some(&cluster),
        },
    )
    .unwrap();
    assert_eq!(checked.priority, 100);
    assert_eq!(
        checked.requests["train-0"],
        Request {
            gpus: 1,
            gpu_milli: 1000,
            gpu_memory_mib: 40 * 1024,
            gpu_models: vec!["H100".into()],
            ..Request::default()
        }
    );
    assert_eq!(
        (
            checked.requests["eval"].gpus,
            checked.requests["eval"].gpu_milli
        ),
        (1, 500)
    );
    assert_eq!(checked.requests["prep"].cpu_milli, 8000);
    assert_eq!(
        checked.dag["prep"],
        DagFacts {
            dependents: 3,
            critical_path_rank: 3
        }
    );
}

#[test]
fn each_kind_of_problem_is_reported_with_its_path_task_and_a_precise_message() {
    struct Case {
        name: &'static str,
        yaml: String,
        want: Vec<&'static str>,
    }
    let cases = vec![
        Case {
            name: "an unknown field names the field, suggests the likely one and lists the rest",
            yaml: good_with("{gpus: 1, gpuModels", "{gpu: 1, gpuModels"),
            want: vec![
                "spec.tasks[1].resources.gpu (task \"train-0\"): unknown field \"gpu\" (did you mean \"gpus\"?); known fields: cpu, gpuFraction, gpuMemory, gpuMilli, gpuModels, gpus, memory, migProfile, rightSize",
                "spec.tasks[1].resources.gpuMemory (task \"train-0\"): is set but the task requests no GPU",
                "spec.tasks[1].resources.gpuModels (task \"train-0\"): is set but the task requests no GPU",
            ],
        },
        Case {
            name: "a bad memory quantity says which unit to use",
            yaml: good_with("memory: 32Gi", "memory: 32GB"),
            want: vec![
                "spec.tasks[0].resources.memory (task \"prep\"): \"32GB\" has an unknown unit \"GB\" (use Gi or G): use a number with an optional suffix Ki, Mi, Gi, Ti (or k, M, G, T), e.g. \"64Gi\"",
            ],
        },
        Case {
            name: "a bad CPU quantity",
            yaml: good_with("cpu: \"8\"", "cpu: \"8 cores\""),
            want: vec![
                "spec.tasks[0].resources.cpu (task \"prep\"): \"8 cores\" is not a CPU quantity: use cores (\"16\", \"0.5\") or millicores (\"500m\")",
            ],
        },
        Case {
            name: "two GPU requests at once",
            yaml: good_with("{gpuFraction: \"0.5\"}", "{gpuFraction: \"0.5\", gpus: 1}"),
            want: vec![
                "spec.tasks[3].resources.gpuFraction (task \"eval\"): give only one of gpus, gpuFraction, gpuMilli and migProfile (found gpus and gpuFraction)",
            ],
        },
        Case {
            name: "a duplicate task name points at the first one",
            yaml: good_with("- name: eval", "- name: prep"),
            want: vec![
                "spec.tasks[3].name (task \"prep\"): duplicate task name \"prep\" (also spec.tasks[0])",
            ],
        },
        Case {
            name: "an unknown dependency suggests the likely name",
            yaml: good_with("after: [prep]", "after: [perp]"),
            want: vec![
                "spec.tasks[1].after[0] (task \"train-0\"): unknown task \"perp\" (did you mean \"prep\"?)",
            ],
        },
        Case {
            name: "a cycle is printed in run order",
            yaml: good_with(
                "command: [python, prep.py]",
                "command: [python, prep.py]\n      after: [eval]",
            ),
            want: vec![
                "spec.tasks[0].after (task \"prep\"): dependency cycle: prep -> train-0 -> eval -> prep (each task waits for the one before it)",
            ],
        },
        Case {
            name: "gang members must not wait for each other",
            yaml: good_with(
                "after: [prep]\n      gang: train\n    - name: train-1",
                "after: [prep, train-1]\n      gang: train\n    - name: train-1",
            ),
            want: vec![
                "spec.tasks[1].after (task \"train-0\"): waits for \"train-1\", a member of its own gang \"train\"; members start together, so none may wait for another",
            ],
        },
        Case {
            name: "a gang of one",
            yaml: good_with("      gang: train\n    - name: train-1", "    - name: train-1"),
            want: vec![
                "spec.tasks[2].gang (task \"train-1\"): gang \"train\" has one member; a gang is two or more tasks that start together (remove `gang` or add members)",
            ],
        },
        Case {
            name: "an unknown team lists the known ones",
            yaml: good_with("team: vision", "team: visoin"),
            want: vec![
                "metadata.team: unknown team \"visoin\" (did you mean \"vision\"?); known teams: vision, nlp",
            ],
        },
        Case {
            name: "an unknown priority class lists the classes by priority",
            yaml: good_with("priorityClass: standard", "priorityClass: urgent"),
            want: vec![
                "metadata.priorityClass: unknown priority class \"urgent\"; known classes: batch (0), standard (100), critical (1000)",
            ],
        },
        Case {
            name: "a request no node could ever hold says why for each node shape",
            yaml: good_with("{gpuFraction: \"0.5\"}", "{gpus: 16, gpuMemory: 60Gi}"),
            want: vec![
                "spec.tasks[3].resources (task \"eval\"): no node could ever run this task, which needs 16 GPUs, 61440 MiB GPU memory: 2x4:H100: 4 GPUs per node, 2 nodes (4 needed); 1x8:L4: 23034 MiB per GPU",
            ],
        },
        Case {
            name: "a gang larger than the GPUs of its model",
            yaml: GOOD.replace("{gpus: 1, gpuModels: [H100]", "{gpus: 4, gpuModels: [H100]").replacen(
                "    - name: eval",
                "    - name: train-2\n      resources: {gpus: 4, gpuModels: [H100], gpuMemory: 40Gi}\n      command: [torchrun, train.py]\n      gang: train\n    - name: train-3\n      resources: {gpus: 4, gpuModels: [H100], gpuMemory: 40Gi}\n      command: [torchrun, train.py]\n      gang: train\n    - name: eval",
                1,
            ),
            want: vec![
                "spec.tasks[1].gang (task \"train-0\"): gang \"train\" needs 16 GPUs at once (4 members × 4 GPUs of H100, 40960 MiB GPU memory); the nodes that fit its members have 8 GPUs (2x4:H100, 1x8:L4)",
            ],
        },
        Case {
            name: "right-sizing needs a GPU request of its own: not CPU-only, not MIG, not a gang's",
            yaml: good_with("{cpu: \"8\", memory: 32Gi}", "{cpu: \"8\", memory: 32Gi, rightSize: true}")
                .replacen(
                    "{gpus: 1, gpuModels: [H100], gpuMemory: 40Gi}",
                    "{gpus: 1, gpuModels: [H100], gpuMemory: 40Gi, rightSize: true}",
                    1,
                )
                .replacen("{gpuFraction: \"0.5\"}", "{migProfile: 1g.10gb, rightSize: true}", 1),
            want: vec![
                "spec.tasks[0].resources.rightSize (task \"prep\"): is set but the task requests no GPU: there is nothing to right-size",
                "spec.tasks[3].resources.rightSize (task \"eval\"): cannot resize a MIG instance: ask for gpus or gpuFraction instead",
                "spec.tasks[1].resources.rightSize (task \"train-0\"): gang \"train\" members cannot be right-sized: the advice is per task and would split the request its members must share",
            ],
        },
        Case {
            name: "durations and retries",
            yaml: good_with(
                "command: [python, eval.py]",
                "command: [python, eval.py]\n      maxRuntime: 2 fortnights\n      deadline: tomorrow\n      retry: {maxAttempts: 0}\n      checkpoint: {supported: false, interval: 10m}",
            ),
            want: vec![
                "spec.tasks[3].maxRuntime (task \"eval\"): \"2 fortnights\" is not a duration (unknown time unit \"fortnights\", supported units: ns, us/µs, ms, sec, min, hours, days, weeks, months, years (and few variations)); use e.g. 90s, 45m, 2h",
                "spec.tasks[3].deadline (task \"eval\"): \"tomorrow\" is neither a duration after submission (\"6h\") nor an RFC 3339 time (\"2026-12-01T18:00:00Z\")",
                "spec.tasks[3].retry.maxAttempts (task \"eval\"): must be at least 1 (the first run counts)",
                "spec.tasks[3].checkpoint.interval (task \"eval\"): is set but checkpoint.supported is false",
            ],
        },
        Case {
            name: "a wrong apiVersion, a wrongly typed field and a missing command, all at once",
            yaml: good_with("apiVersion: allot/v1", "apiVersion: allot/v2")
                .replacen("command: [python, prep.py]", "command: python prep.py", 1)
                .replacen("      command: [python, eval.py]\n", "", 1),
            want: vec![
                "apiVersion: must be \"allot/v1\", found \"allot/v2\"",
                "spec.tasks[0].command (task \"prep\"): expected array, found string \"python prep.py\"",
                "spec.tasks[3] (task \"eval\"): missing field \"command\"",
            ],
        },
    ];
    for case in cases {
        let got = problems(&case.yaml, Format::Yaml);
        assert_eq!(got, case.want, "{}", case.name);
    }
}

#[test]
fn unknown_fields_and_semantic_problems_come_out_together() {
    let yaml = good_with("team: vision", "team: vision\n  owner: alice")
        .replacen("after: [prep]", "after: [prep, nope]", 1)
        .replacen(
            "command: [python, prep.py]",
            "command: [python, prep.py]\n      after: [eval]",
            1,
        );
    let got = problems(&yaml, Format::Yaml);
    assert_eq!(
        got,
        [
            "metadata.owner: unknown field \"owner\"; known fields: labels, name, priorityClass, project, team",
            "spec.tasks[1].after[1] (task \"train-0\"): unknown task \"nope\"",
            "spec.tasks[0].after (task \"prep\"): dependency cycle: prep -> train-0 -> eval -> prep (each task waits for the one before it)",
        ]
    );
}

#[test]
fn syntax_errors_carry_line_and_column_in_yaml_and_json() {
    let yaml = "apiVersion: allot/v1\nkind: Workload\nmetadata: {name: x\n";
    let got = problems(yaml, Format::Yaml);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].starts_with("not valid YAML: ") && got[0].ends_with("at line 4 column 1"),
        "{got:?}"
    );

    let json = "{\n  \"apiVersion\": \"allot/v1\",\n  \"kind\": \"Workload\",,\n}";
    let got = problems(json, Format::Json);
    assert_eq!(
        got,
        ["not valid JSON: key must be a string at line 3 column 22"],
        "{got:?}"
    );
}

#[test]
fn json_specs_are_read_like_yaml_ones() {
    let value: serde_json::Value = yaml_serde::from_str(GOOD).unwrap();
    let json = serde_json::to_string_pretty(&value).unwrap();
    assert_eq!(problems(&json, Format::Json), Vec::<String>::new());
    let json = json.replacen("\"gpus\"", "\"gpu\"", 1);
    let got = problems(&json, Format::Json);
    assert!(
        got[0].starts_with("spec.tasks[1].resources.gpu (task \"train-0\"): unknown field \"gpu\""),
        "{got:?}"
    );
}

#[test]
fn without_teams_or_cluster_only_static_checks_run() {
    let yaml = good_with("team: vision", "team: anyone").replacen(
        "{gpuFraction: \"0.5\"}",
        "{gpus: 64}",
        1,
    );
    let checked = check(&yaml, Format::Yaml, Context::default()).unwrap();
    assert_eq!(checked.priority, 100);
}

#[test]
fn out_of_range_durations_and_numbers_that_are_not_finite_name_the_task_and_field() {
    struct Case {
        name: &'static str,
        yaml: String,
        want: Vec<&'static str>,
    }
    let cases = vec![
        Case {
            name: "a duration whose milliseconds overflow is too long, not 384 ms",
            yaml: good_with(
                "command: [python, eval.py]",
                "command: [python, eval.py]\n      durationEstimate: 18446744073709552s\n      maxRuntime: 400 days\n      deadline: 9999999999h\n      retry: {maxAttempts: 2, backoff: 18446744073709552s}\n      checkpoint: {supported: true, interval: 366d}",
            ),
            want: vec![
                "spec.tasks[3].durationEstimate (task \"eval\"): \"18446744073709552s\" is longer than 365 days, the longest duration a spec may give",
                "spec.tasks[3].maxRuntime (task \"eval\"): \"400 days\" is longer than 365 days, the longest duration a spec may give",
                "spec.tasks[3].retry.backoff (task \"eval\"): \"18446744073709552s\" is longer than 365 days, the longest duration a spec may give",
                "spec.tasks[3].checkpoint.interval (task \"eval\"): \"366d\" is longer than 365 days, the longest duration a spec may give",
                "spec.tasks[3].deadline (task \"eval\"): \"9999999999h\" is longer than 365 days, the longest duration a spec may give",
            ],
        },
        Case {
            name: "NaN and infinite quantities say what the field takes",
            yaml: good_with("{gpus: 1, gpuModels", "{gpus: .nan, gpuModels")
                .replacen(
                    "{cpu: \"8\", memory: 32Gi}",
                    "{cpu: .inf, memory: -.inf}",
                    1,
                )
                .replacen("{gpuFraction: \"0.5\"}", "{gpuFraction: .NaN}", 1),
            want: vec![
                "spec.tasks[0].resources.cpu (task \"prep\"): .inf is not a finite number; expected cores (\"16\", \"0.5\") or millicores (\"500m\")",
                "spec.tasks[0].resources.memory (task \"prep\"): -.inf is not a finite number; expected bytes with a suffix Ki, Mi, Gi, Ti (or k, M, G, T), e.g. \"64Gi\"",
                "spec.tasks[1].resources.gpus (task \"train-0\"): .nan is not a finite number; expected a whole number of GPUs, e.g. 4",
                "spec.tasks[3].resources.gpuFraction (task \"eval\"): .nan is not a finite number; expected a share of one GPU between 0 and 1 (exclusive), e.g. \"0.25\"",
            ],
        },
        Case {
            name: "null, negative and out-of-range numbers say what the field takes",
            yaml: good_with("{gpus: 1, gpuModels", "{gpus: ~, gpuModels")
                .replacen("{gpuFraction: \"0.5\"}", "{gpuMilli: -250}", 1)
                .replacen(
                    "command: [python, eval.py]",
                    "command: [python, eval.py]\n      retry: {maxAttempts: -1}",
                    1,
                ),
            want: vec![
                "spec.tasks[1].resources.gpus (task \"train-0\"): expected a whole number of GPUs, e.g. 4, found null",
                "spec.tasks[3].resources.gpuMilli (task \"eval\"): -250 is out of range; expected thousandths of one GPU, 1 to 999, e.g. 250",
                "spec.tasks[3].retry.maxAttempts (task \"eval\"): -1 is out of range; expected the number of runs in all, 1 or more, e.g. 3",
            ],
        },
        Case {
            name: "a negative number of GPUs",
            yaml: good_with("{gpus: 1, gpuModels", "{gpus: -2, gpuModels"),
            want: vec![
                "spec.tasks[1].resources.gpus (task \"train-0\"): \"-2\" is negative: use a whole number of GPUs, e.g. 4 (0 for none)",
                "spec.tasks[1].resources.gpuMemory (task \"train-0\"): is set but the task requests no GPU",
                "spec.tasks[1].resources.gpuModels (task \"train-0\"): is set but the task requests no GPU",
            ],
        },
    ];
    for case in cases {
        let got = problems(&case.yaml, Format::Yaml);
        assert_eq!(got, case.want, "{}", case.name);
    }
}

/// `GOOD` as pretty JSON with `from` replaced by `to` (once).
fn good_json_with(from: &str, to: &str) -> String {
    let value: serde_json::Value = yaml_serde::from_str(GOOD).unwrap();
    let json = serde_json::to_string_pretty(&value).unwrap();
    assert!(json.contains(from), "{from:?} is not in {json}");
    json.replacen(from, to, 1)
}

#[test]
fn a_key_a_json_object_gives_twice_is_refused_at_every_level_by_path() {
    let json = good_json_with(
        "\"team\": \"vision\"",
        "\"team\": \"vision\",\"team\": \"nlp\"",
    )
    .replacen("\"gpus\": 1", "\"gpus\": 1, \"gpus\": 8", 1)
    .replacen(
        "\"kind\": \"Workload\",",
        "\"kind\": \"Workload\", \"kind\": \"Workload\",",
        1,
    )
    .replacen(
        "\"name\": \"eval\"",
        "\"name\": \"eval\", \"name\": \"eval\", \"name\": \"test\"",
        1,
    );
    assert_eq!(
        problems(&json, Format::Json),
        [
            "kind: duplicate key \"kind\": this object gives it more than once; give each key once",
            "metadata.team: duplicate key \"team\": this object gives it more than once; give each key once",
            "spec.tasks[1].resources.gpus (task \"train-0\"): duplicate key \"gpus\": this object gives it more than once; give each key once",
            "spec.tasks[3].name (task \"eval\"): duplicate key \"name\": this object gives it more than once; give each key once",
        ]
    );
    // The same spec without them is valid: nothing else was made of the repeats.
    assert_eq!(
        problems(&good_json_with("{", "{"), Format::Json),
        Vec::<String>::new()
    );
    // YAML refuses them too, as a syntax error.
    let yaml = good_with("team: vision", "team: vision\n  team: nlp");
    let got = problems(&yaml, Format::Yaml);
    assert!(
        got[0].contains("duplicate entry with key \"team\""),
        "{got:?}"
    );
}

#[test]
fn a_spec_too_large_to_publish_or_with_too_many_tasks_is_refused_with_the_limit() {
    use crate::limits::{MAX_SPEC_BYTES, MAX_TASKS};

    let mut many = String::from(GOOD);
    for i in 0..=MAX_TASKS - 4 {
        many.push_str(&format!("    - {{name: t{i}, command: [x]}}\n"));
    }
    assert_eq!(
        problems(&many, Format::Yaml),
        [format!(
            "spec.tasks: {} tasks; at most {MAX_TASKS} in one workload — split the workload",
            MAX_TASKS + 1
        )]
    );
    many.push_str(&format!("    - {{name: t{MAX_TASKS}, command: [x]}}\n"));
    assert_eq!(
        problems(&many, Format::Yaml),
        [format!(
            "spec.tasks: {} tasks; at most {MAX_TASKS} in one workload — split the workload",
            MAX_TASKS + 2
        )]
    );

    // Under the limit as YAML, over it as the JSON that would be published.
    let args = vec!["a"; MAX_SPEC_BYTES / 3].join(",");
    let yaml = good_with("command: [python, eval.py]", &format!("command: [{args}]"));
    assert!(yaml.len() < MAX_SPEC_BYTES);
    let got = problems(&yaml, Format::Yaml);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].starts_with("the spec is ")
            && got[0].ends_with(
                " bytes as published (compact JSON); at most 524288 bytes (512 KiB), so the \
                 submission fits in one NATS message — split the workload"
            ),
        "{got:?}"
    );

    // Text over the limit is not parsed at all.
    let huge = format!("{GOOD}#{}\n", " ".repeat(MAX_SPEC_BYTES));
    assert_eq!(
        problems(&huge, Format::Yaml),
        [format!(
            "the spec is {} bytes; at most 524288 bytes (512 KiB), so the submission fits in one \
             NATS message — split the workload",
            huge.len()
        )]
    );
}

//! `allot submit --wait` and `--follow` as a CI job runs them: the binary against a real
//! nats-server, the planner, the allocator and a collector whose executor runs each task's
//! command as a process (see [`crate::cluster`]).

use crate::cluster::Cluster;

/// CPU preprocessing → a gang of two 2-GPU trainers → a 1-GPU evaluation.
const PIPELINE: &str = r#"
apiVersion: allot/v1
kind: Workload
metadata: {name: train-eval, team: vision}
spec:
  tasks:
    - name: preprocess
      resources: {cpu: "1", memory: 1Gi}
      command: [sh, -c, "echo preprocessing"]
    - name: train-0
      resources: {gpus: 2, cpu: "1"}
      command: [sh, -c, "sleep 0.2"]
      after: [preprocess]
      gang: train
    - name: train-1
      resources: {gpus: 2, cpu: "1"}
      command: [sh, -c, "sleep 0.2"]
      after: [preprocess]
      gang: train
    - name: eval
      resources: {gpus: 1}
      command: [sh, -c, "echo evaluated"]
      after: [train-0, train-1]
"#;

/// A step that keeps failing, retried once, and a GPU step after it.
const FLAKY: &str = r#"
apiVersion: allot/v1
kind: Workload
metadata: {name: flaky, team: vision}
spec:
  tasks:
    - name: prep
      resources: {cpu: "1"}
      command: [sh, -c, "echo broken >&2; exit 1"]
      retry: {maxAttempts: 2, backoff: 10ms}
    - name: train
      resources: {gpus: 1}
      command: [sh, -c, "true"]
      after: [prep]
"#;

/// A step that runs far longer than anyone waits.
const SLOW: &str = r#"
apiVersion: allot/v1
kind: Workload
metadata: {name: slow, team: vision}
spec:
  tasks:
    - name: soak
      command: [sh, -c, "sleep 600"]
"#;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The `state` column of a `--follow` line about `task` (`[+   0.012] task  state  …`).
fn position(log: &str, task: &str, state: &str) -> usize {
    log.lines()
        .position(|l| {
            let mut words = l
                .split_once(']')
                .map_or("", |(_, rest)| rest)
                .split_whitespace();
            words.next() == Some(task) && words.next() == Some(state)
        })
        .unwrap_or_else(|| panic!("no line `{task} {state}` in:\n{log}"))
}

/// The summary's row for `task`, its words without the ID column, and that id (`task-42`, or
/// `-` for a task never run).
fn summary_row<'a>(log: &'a str, task: &str) -> (Vec<&'a str>, &'a str) {
    log.lines()
        .filter(|l| !l.starts_with('['))
        .find_map(|l| {
            let mut words: Vec<&str> = l.split_whitespace().collect();
            (words.len() > 2 && words[0] == task).then(|| {
                let id = words.remove(1);
                assert!(id == "-" || id.starts_with("task-"), "an id column: {l}");
                (words, id)
            })
        })
        .unwrap_or_else(|| panic!("no summary row for {task} in:\n{log}"))
}

/// A guard against a hung test; no assertion depends on it.
const GUARD: &str = "120s";

#[test]
fn follow_prints_each_stage_in_order_and_wait_exits_0_once_the_pipeline_succeeded() {
    let cluster = Cluster::start(&[("n1", 4)]);
    let out = cluster.submit_with(PIPELINE, "ci-1", &["--follow", "--timeout", GUARD]);
    let log = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{log}\n{}", text(&out.stderr));
    let id = log.lines().next().unwrap().to_owned();
    assert!(id.starts_with("train-eval-"), "{log}");

    // Stage by stage: nothing of training before preprocessing completed, nothing of
    // evaluation before both trainers completed.
    for (before, after) in [
        (("preprocess", "ready"), ("preprocess", "granted")),
        (("preprocess", "granted"), ("preprocess", "started")),
        (("preprocess", "started"), ("preprocess", "completed")),
        (("preprocess", "completed"), ("train-0", "ready")),
        (("preprocess", "completed"), ("train-0", "granted")),
        (("preprocess", "completed"), ("train-1", "granted")),
        (("train-0", "completed"), ("eval", "granted")),
        (("train-1", "completed"), ("eval", "granted")),
        (("eval", "completed"), ("(workload)", "succeeded")),
    ] {
        assert!(
            position(&log, before.0, before.1) < position(&log, after.0, after.1),
            "{before:?} before {after:?}:\n{log}"
        );
    }
    let train_grant = &log
        .lines()
        .nth(position(&log, "train-0", "granted"))
        .unwrap();
    assert!(
        train_grant.ends_with("granted      n1 GPUs 0,1")
            || train_grant.ends_with("granted      n1 GPUs 2,3"),
        "{log}"
    );
    assert!(
        log.contains(&format!("workload {id} succeeded after ")),
        "the summary:\n{log}"
    );
    for task in ["preprocess", "train-0", "train-1", "eval"] {
        let (row, task_id) = summary_row(&log, task);
        assert_eq!(row[..3], [task, "succeeded", "1/1"], "{log}");
        // The id the summary names is the one the ready line printed.
        let ready = log.lines().nth(position(&log, task, "ready")).unwrap();
        assert!(
            ready.contains(&format!("ready        {task_id}: ")),
            "{log}"
        );
    }

    // The CI job retried: the same submission is followed to the end it already had.
    let again = cluster.submit_with(PIPELINE, "ci-1", &["--wait", "--timeout", GUARD]);
    let out_again = text(&again.stdout);
    assert_eq!(
        again.status.code(),
        Some(0),
        "{out_again}\n{}",
        text(&again.stderr)
    );
    assert!(text(&again.stderr).contains("already submitted"));
    assert!(
        out_again.starts_with(&format!("{id}\nworkload {id} succeeded after ")),
        "--wait prints the id and the summary only:\n{out_again}"
    );
}

#[test]
fn wait_exits_3_and_names_the_failing_task_when_the_pipeline_fails() {
    let cluster = Cluster::start(&[("n1", 4)]);
    let out = cluster.submit_with(FLAKY, "ci-7", &["--wait", "--timeout", GUARD]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    let id = stdout.lines().next().unwrap();
    assert!(
        stdout.contains(&format!("workload {id} failed after ",))
            && stdout.contains(": task prep failed after 2 attempts: exit status 1\n"),
        "{stdout}"
    );
    let (prep, prep_id) = summary_row(&stdout, "prep");
    assert_eq!(
        prep,
        ["prep", "failed", "2/2", "exit", "status", "1"],
        "{stdout}"
    );
    assert!(prep_id.starts_with("task-"), "{stdout}");
    assert_eq!(
        summary_row(&stdout, "train"),
        (
            vec![
                "train",
                "not",
                "run",
                "0/1",
                "its",
                "dependencies",
                "never",
                "succeeded"
            ],
            "-"
        ),
        "{stdout}"
    );

    // The same, followed as JSON lines: every line parses; the retry and the end are there.
    let json = cluster.submit_with(FLAKY, "ci-7", &["--follow", "--output", "json"]);
    assert_eq!(json.status.code(), Some(3), "{}", text(&json.stderr));
    let lines: Vec<serde_json::Value> = text(&json.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines[0]["duplicate"], true);
    let states: Vec<(String, String)> = lines
        .iter()
        .filter_map(|l| {
            Some((
                l["task"].as_str()?.to_owned(),
                l["state"].as_str()?.to_owned(),
            ))
        })
        .collect();
    // The predictor's line for each attempt comes whenever it does (it is not waited for):
    // at most one per attempt, and the rest in order.
    let predicted = states
        .iter()
        .filter(|(t, s)| t == "prep" && s == "predicted")
        .count();
    assert!(predicted <= 2, "{states:?}");
    let prep: Vec<&str> = states
        .iter()
        .filter(|(t, s)| t == "prep" && s != "predicted")
        .map(|(_, s)| s.as_str())
        .collect();
    assert_eq!(
        prep,
        [
            "ready", "granted", "started", "failed", "retried", "granted", "started", "failed"
        ]
    );
    let summary = &lines.last().unwrap()["summary"];
    assert_eq!(summary["ending"], "failed");
    assert_eq!(summary["tasks"][0]["state"], "failed");
    // Each attempt has its own id; the summary names the last one.
    let prep_ids: Vec<&str> = lines
        .iter()
        .filter(|l| l["task"] == "prep")
        .filter_map(|l| l["task_id"].as_str())
        .collect();
    assert_eq!(
        prep_ids.len(),
        prep.len() + predicted,
        "every task line has its id"
    );
    assert_ne!(prep_ids[0], prep_ids[prep_ids.len() - 1]);
    assert_eq!(summary["tasks"][0]["task_id"], prep_ids[prep_ids.len() - 1]);
}

#[test]
fn wait_gives_up_with_exit_5_when_the_timeout_runs_out_first() {
    let cluster = Cluster::start(&[("n1", 4)]);
    let out = cluster.submit_with(SLOW, "ci-9", &["--wait", "--timeout", "3s"]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(5),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    // It says how long it waited, not how long ago the last event came.
    assert!(
        stdout.contains("is still running: stopped waiting after 3.000s (--timeout)"),
        "{stdout}"
    );
}

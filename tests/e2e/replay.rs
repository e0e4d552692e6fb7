//! `allot sim --journal` then `allot replay --verify` and `allot explain`: an auditor
//! recomputes every decision of a run from its journal, and a tampered journal is caught at
//! the entry that was changed — as a broken invariant (a GPU or a task granted twice) where
//! it is one, else as a difference.

use std::path::Path;

use crate::support::allot;

/// A small generic trace: a burst of jobs that must queue and preempt on 2 nodes × 4 GPUs.
fn trace(dir: &Path) -> std::path::PathBuf {
    let mut csv = String::from("submit_time,duration,num_gpus,team,priority\n");
    for i in 0..60u64 {
        let gpus = [1, 2, 4, 8][(i % 4) as usize];
        let duration = 600 + (i * 7_919) % 7_200;
        let team = ["vision", "nlp"][(i % 2) as usize];
        csv += &format!("{},{duration},{gpus},{team},{}\n", i * 120, i % 3);
    }
    let path = dir.join("trace.csv");
    std::fs::write(&path, csv).unwrap();
    path
}

fn record(dir: &Path, policy: &str) -> std::path::PathBuf {
    let journal = dir.join(format!("{policy}.jsonl"));
    let out = allot(dir)
        .args([
            "sim",
            "-q",
            "--cluster",
            "2x4",
            "--policies",
            policy,
            "--trace",
        ])
        .arg(format!("generic:{}", trace(dir).display()))
        .arg("--journal")
        .arg(&journal)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    journal
}

#[test]
fn a_recorded_run_replays_identically_and_a_tampered_one_names_the_entry() {
    let dir = tempfile::tempdir().unwrap();
    for policy in ["fifo", "kueue", "allot"] {
        let journal = record(dir.path(), policy);
        let out = allot(dir.path())
            .args(["replay", "--verify", "--journal"])
            .arg(&journal)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{policy}: {stdout}");
        assert!(stdout.contains("recomputed identically"), "{stdout}");

        // Rewrite one grant's reason: the replay must stop at that entry and show both.
        let text = std::fs::read_to_string(&journal).unwrap();
        let (line_no, line) = text
            .lines()
            .enumerate()
            .find(|(_, l)| l.contains(r#""decision":"granted""#))
            .expect("a grant");
        let tampered_line = line.replacen(
            r#""reason":""#,
            r#""reason":"granted because the auditor was not looking; "#,
            1,
        );
        assert_ne!(&tampered_line, line);
        let tampered: Vec<&str> = text
            .lines()
            .enumerate()
            .map(|(i, l)| {
                if i == line_no {
                    tampered_line.as_str()
                } else {
                    l
                }
            })
            .collect();
        let bad = dir.path().join(format!("{policy}-tampered.jsonl"));
        std::fs::write(&bad, tampered.join("\n") + "\n").unwrap();
        let out = allot(dir.path())
            .args(["replay", "--verify", "--journal"])
            .arg(&bad)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{policy}: tampering went unnoticed");
        // Line 1 is the header, so line n holds entry n - 1.
        assert!(
            stdout.contains(&format!("MISMATCH at entry {}:", line_no)),
            "{policy}: {stdout}"
        );
        assert!(
            stdout.contains("logged:") && stdout.contains("recomputed:"),
            "{stdout}"
        );
    }
}

#[test]
fn a_journal_granting_a_task_twice_fails_verification_naming_the_task_lease_and_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let journal = record(dir.path(), "allot");
    let text = std::fs::read_to_string(&journal).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // Line 1 is the header, so line n (0-based) holds entry n.
    let (at, line) = lines
        .iter()
        .enumerate()
        .find(|(_, l)| l.contains(r#""decision":"granted""#))
        .expect("a grant");
    let entry: serde_json::Value = serde_json::from_str(line).unwrap();
    let grant = entry["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["decision"] == "granted")
        .unwrap()
        .clone();
    let (task, lease) = (
        grant["task"].as_u64().unwrap(),
        grant["lease"].as_u64().unwrap(),
    );
    let share = &grant["placement"]["shares"][0];
    let (node, gpu) = (
        share["node"].as_u64().unwrap(),
        share["gpus"][0][0].as_u64().unwrap(),
    );
    // `tamper` edits a copy of the grant, which is then logged a second time in its entry.
    let replay_with_second_grant = |name: &str, tamper: &dyn Fn(&mut serde_json::Value)| {
        let mut edited = entry.clone();
        let mut copy = grant.clone();
        tamper(&mut copy);
        edited["decisions"].as_array_mut().unwrap().push(copy);
        let mut out: Vec<String> = lines.iter().map(|l| (*l).to_owned()).collect();
        out[at] = serde_json::to_string(&edited).unwrap();
        let bad = dir.path().join(name);
        std::fs::write(&bad, out.join("\n") + "\n").unwrap();
        let out = allot(dir.path())
            .args(["replay", "--verify", "--journal"])
            .arg(&bad)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(out.status.code(), Some(1), "{name}: {stdout}");
        assert!(
            stdout.contains(&format!("INVARIANT BROKEN at entry {at}:")),
            "{name}: {stdout}"
        );
        assert!(!stdout.contains("MISMATCH"), "{name}: {stdout}");
        stdout
    };

    let stdout = replay_with_second_grant("granted-twice.jsonl", &|_| {});
    let want = format!(
        "task-{task} granted twice: lease {lease} while it still holds lease {lease} (granted at \
         entry {at}"
    );
    assert!(stdout.contains(&want), "{want:?} not in:\n{stdout}");
    assert!(stdout.contains("recomputed:"), "{stdout}");

    // The same GPUs granted to another task under a fresh lease: the GPU is named.
    let stdout = replay_with_second_grant("gpu-twice.jsonl", &|copy| {
        copy["task"] = serde_json::json!(1_000_000);
        copy["lease"] = serde_json::json!(1_000_000);
    });
    for want in [
        format!("GPU {gpu} of node #{node} "),
        "held twice: task-1000000 is granted lease 1000000".to_owned(),
        format!("lease {lease} (task-{task}, 1000 milli-GPU)"),
    ] {
        assert!(stdout.contains(&want), "{want:?} not in:\n{stdout}");
    }
}

#[test]
fn explain_tells_a_tasks_story() {
    let dir = tempfile::tempdir().unwrap();
    let journal = record(dir.path(), "allot");
    let out = allot(dir.path())
        .args(["explain", "task-5", "--journal"])
        .arg(&journal)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("submitted by team nlp"), "{stdout}");
    assert!(stdout.contains("granted lease"), "{stdout}");
    assert!(stdout.contains("released lease"), "{stdout}");
    let out = allot(dir.path())
        .args(["explain", "task-999", "--journal"])
        .arg(&journal)
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn a_journal_asked_of_the_packing_experiment_is_refused_not_silently_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("openb.jsonl");
    let out = allot(dir.path())
        .args([
            "sim",
            "-q",
            "--scenario",
            "openb-packing",
            "--policies",
            "fgd",
        ])
        .arg("--journal")
        .arg(&journal)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--journal") && stderr.contains("openb-packing"),
        "the error names the flag and the scenario: {stderr}"
    );
    assert!(!journal.exists(), "nothing is written");
}

//! `allot sim --journal` then `allot replay --verify` and `allot explain`: an auditor
//! recomputes every decision of a run from its journal, and a tampered journal is caught at
//! the entry that was changed.

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

        // Move one grant to another GPU: the replay must stop at that entry and show both.
        let text = std::fs::read_to_string(&journal).unwrap();
        let (line_no, line) = text
            .lines()
            .enumerate()
            .find(|(_, l)| {
                l.contains(r#""decision":"granted""#) && l.contains(r#""gpus":[[0,1000]"#)
            })
            .expect("a grant of GPU 0");
        let tampered_line = line.replacen(r#""gpus":[[0,1000]"#, r#""gpus":[[3,1000]"#, 1);
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

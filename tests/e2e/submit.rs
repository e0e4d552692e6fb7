//! `allot submit` as a CI job runs it: against a real nats-server, retried, and with bad specs.

use std::path::{Path, PathBuf};
use std::process::Output;

use allot_events::{AnyEvent, WorkloadEvent, decode};
use allot_testkit::NatsServer;

use crate::support::allot;

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name)
}

fn submit(dir: &Path, url: &str, file: &Path, run_id: &str) -> Output {
    allot(dir)
        .arg("submit")
        .arg(file)
        .args(["--run-id", run_id, "--nats", url, "--submitter", "ci@test"])
        .arg("--teams")
        .arg(example("teams.yaml"))
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Every message in WORKLOADS: (subject, Nats-Msg-Id, decoded event).
fn workloads(rt: &tokio::runtime::Runtime, url: &str) -> Vec<(String, String, AnyEvent)> {
    rt.block_on(async {
        let client = async_nats::connect(url).await.unwrap();
        allot_testkit::streams::read_all(&client, allot_bus::streams::names::WORKLOADS)
            .await
            .into_iter()
            .map(|m| {
                let id = m
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("Nats-Msg-Id"))
                    .map(|v| v.to_string())
                    .unwrap_or_default();
                (m.subject.to_string(), id, decode(&m.payload).unwrap().data)
            })
            .collect()
    })
}

/// Creates Allot's streams on the server at `url`, as any service does at start.
fn create_streams(rt: &tokio::runtime::Runtime, url: &str) {
    rt.block_on(async {
        let client = async_nats::connect(url).await.unwrap();
        let js = async_nats::jetstream::new(client);
        allot_bus::ensure_streams(&js, &allot_bus::catalog(1))
            .await
            .unwrap();
    });
}

#[test]
fn a_retried_submission_is_stored_once_a_new_run_again_and_a_bad_spec_never() {
    let server = NatsServer::start();
    let url = server.url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    create_streams(&rt, &url);
    let dir = tempfile::tempdir().unwrap();
    let spec = example("train-eval.yaml");

    // The first submission, then the same CI run retried: one workload, one stored event.
    let first = submit(dir.path(), &url, &spec, "ci-1842");
    assert!(first.status.success(), "{}", text(&first.stderr));
    let id = text(&first.stdout).trim().to_owned();
    assert!(
        id.starts_with("train-eval-") && id.len() == "train-eval-".len() + 10,
        "{id}"
    );
    let stderr = text(&first.stderr);
    assert!(
        stderr.contains("the inventory service is not running, so node capacity was not checked (static checks only)"),
        "{stderr}"
    );
    let retried = submit(dir.path(), &url, &spec, "ci-1842");
    assert!(retried.status.success(), "{}", text(&retried.stderr));
    assert_eq!(
        text(&retried.stdout).trim(),
        id,
        "a retry names the same workload"
    );
    assert!(
        text(&retried.stderr).contains("already submitted"),
        "{}",
        text(&retried.stderr)
    );
    assert_eq!(workloads(&rt, &url).len(), 1);

    // Another run of the same pipeline is another workload.
    let second = submit(dir.path(), &url, &spec, "ci-1843");
    assert!(second.status.success(), "{}", text(&second.stderr));
    let second_id = text(&second.stdout).trim().to_owned();
    assert_ne!(second_id, id);

    let stored = workloads(&rt, &url);
    assert_eq!(stored.len(), 2);
    for ((subject, msg_id, event), (want_id, want_run)) in stored
        .iter()
        .zip([(&id, "ci-1842"), (&second_id, "ci-1843")])
    {
        assert_eq!(subject, "allot.workload.submitted.vision");
        let AnyEvent::Workload(WorkloadEvent::Submitted(s)) = event else {
            panic!("not a submission: {event:?}");
        };
        assert_eq!(&s.workload_id, want_id);
        assert_eq!(s.run_id.as_deref(), Some(want_run));
        assert_eq!(
            msg_id,
            &allot_workload::submit::msg_id(&s.spec, &s.idempotency_key),
            "Nats-Msg-Id derives from the team, the idempotency key and the spec"
        );
        assert_eq!(
            s.workload_id,
            allot_workload::submit::workload_id(&s.spec, &s.idempotency_key),
            "the workload id derives from the team and the key"
        );
        assert_eq!(s.submitter, "ci@test");
        assert_eq!(s.spec.spec.tasks.len(), 6);
    }

    // A cycle and an unknown field: rejected with both problems, exit 2, nothing published.
    let bad = dir.path().join("bad.yaml");
    let broken = std::fs::read_to_string(&spec)
        .unwrap()
        .replacen(
            "      durationEstimate: 10m\n",
            "      durationEstimate: 10m\n      after: [eval]\n",
            1,
        )
        .replacen("deadline: 12h", "deadline: 12h\n      priority: 7", 1);
    std::fs::write(&bad, broken).unwrap();
    let rejected = submit(dir.path(), &url, &bad, "ci-1844");
    assert_eq!(
        rejected.status.code(),
        Some(2),
        "{}",
        text(&rejected.stderr)
    );
    assert!(rejected.stdout.is_empty());
    let stderr = text(&rejected.stderr);
    assert!(
        stderr.contains(&format!(
            "{}: rejected, 2 problems; nothing was submitted:\n  - spec.tasks[5].priority (task \"eval\"): unknown field \"priority\"; known fields: after, checkpoint, command, deadline, durationEstimate, gang, idleReclaim, image, maxRuntime, name, resources, retry\n  - spec.tasks[0].after (task \"preprocess\"): dependency cycle: preprocess -> train-0 -> eval -> preprocess (each task waits for the one before it)\n",
            bad.display()
        )),
        "{stderr}"
    );
    assert_eq!(workloads(&rt, &url).len(), 2, "nothing more was published");

    // What the bus would have misread: a duration whose milliseconds overflow (it went out as
    // 384 ms) and, in JSON, a key given twice (the last one won).
    let overflow = dir.path().join("overflow.yaml");
    std::fs::write(
        &overflow,
        std::fs::read_to_string(&spec).unwrap().replacen(
            "maxRuntime: 6h",
            "maxRuntime: 18446744073709552s",
            1,
        ),
    )
    .unwrap();
    let twice = dir.path().join("twice.json");
    std::fs::write(
        &twice,
        r#"{"apiVersion":"allot/v1","kind":"Workload","metadata":{"name":"x","team":"vision","team":"nlp"},"spec":{"tasks":[{"name":"a","command":["true"]}]}}"#,
    )
    .unwrap();
    for (file, want) in [
        (
            &overflow,
            "  - spec.tasks[1].maxRuntime (task \"train-0\"): \"18446744073709552s\" is longer than 365 days, the longest duration a spec may give\n",
        ),
        (
            &twice,
            "  - metadata.team: duplicate key \"team\": this object gives it more than once; give each key once\n",
        ),
    ] {
        let rejected = submit(dir.path(), &url, file, "ci-1845");
        let stderr = text(&rejected.stderr);
        assert_eq!(rejected.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(want), "{stderr}");
    }
    assert_eq!(workloads(&rt, &url).len(), 2, "nothing more was published");
}

#[test]
fn validate_lists_every_problem_offline_and_summarizes_a_good_spec() {
    let dir = tempfile::tempdir().unwrap();
    let ok = allot(dir.path())
        .arg("validate")
        .arg(example("train-eval.yaml"))
        .args(["--cluster", "4x8:H100"])
        .output()
        .unwrap();
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    assert!(
        text(&ok.stdout).contains(
            "valid — train-eval (team vision, priority standard = 100): 6 tasks (5 with GPUs), 1 gang, longest chain 3; checked against no teams file (teams not checked, default priority classes), cluster 4x8:H100"
        ),
        "{}",
        text(&ok.stdout)
    );

    let too_small = allot(dir.path())
        .arg("validate")
        .arg(example("train-eval.yaml"))
        .args(["--cluster", "2x1:T4"])
        .output()
        .unwrap();
    assert_eq!(too_small.status.code(), Some(2));
    let stderr = text(&too_small.stderr);
    assert!(
        stderr.contains("  - spec.tasks[1].resources (task \"train-0\"): no node could ever run this task, which needs 1 GPU, 40960 MiB GPU memory, 8000m CPU, 65536 MiB memory: 2x1:T4: 15360 MiB per GPU\n"),
        "{stderr}"
    );
}

#[test]
fn specs_too_large_or_not_text_are_refused_with_exit_2_without_reading_them_whole() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read_to_string(example("train-eval.yaml")).unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    };
    let mut many = good.clone();
    for i in 0..5_000 {
        many.push_str(&format!("    - {{name: extra-{i}, command: [\"true\"]}}\n"));
    }
    let huge = write("huge.yaml", &vec![b'#'; 50 * 1024 * 1024]);
    let latin1 = write(
        "latin1.yaml",
        b"apiVersion: allot/v1\nkind: Workload\nmetadata: {name: caf\xe9}\n",
    );
    let many = write("many.yaml", many.as_bytes());
    let nan = write(
        "nan.yaml",
        good.replacen("gpus: 1, gpuMemory", "gpus: .nan, gpuMemory", 1)
            .as_bytes(),
    );

    struct Case {
        name: &'static str,
        file: PathBuf,
        stdin: Option<PathBuf>,
        want: String,
    }
    let cases = [
        Case {
            name: "a 50 MB file",
            file: huge.clone(),
            stdin: None,
            want: "  - the spec is 52428800 bytes; at most 524288 bytes (512 KiB), so the submission fits in one NATS message — split the workload\n".into(),
        },
        Case {
            // As `< /dev/zero` would: a regression reads 50 MB, not all memory.
            name: "standard input is read no further than the limit",
            file: "-".into(),
            stdin: Some(huge.clone()),
            want: "  - the spec is more than 524288 bytes (reading stopped there); at most 524288 bytes (512 KiB), so the submission fits in one NATS message — split the workload\n".into(),
        },
        Case {
            name: "5,006 tasks",
            file: many,
            stdin: None,
            want: "  - spec.tasks: 5006 tasks; at most 5000 in one workload — split the workload\n".into(),
        },
        Case {
            name: "Latin-1 text",
            file: latin1.clone(),
            stdin: None,
            want: "  - not UTF-8 at byte 57 (0xe9): a spec is UTF-8 text (was it saved as Latin-1 or UTF-16?) at line 3 column 21\n".into(),
        },
        Case {
            name: "Latin-1 text on standard input",
            file: "-".into(),
            stdin: Some(latin1),
            want: "  - not UTF-8 at byte 57 (0xe9): a spec is UTF-8 text (was it saved as Latin-1 or UTF-16?) at line 3 column 21\n".into(),
        },
        Case {
            name: "a GPU count that is not a number",
            file: nan,
            stdin: None,
            want: "  - spec.tasks[1].resources.gpus (task \"train-0\"): .nan is not a finite number; expected a whole number of GPUs, e.g. 4\n".into(),
        },
    ];
    for case in cases {
        let mut cmd = allot(dir.path());
        cmd.arg("validate").arg(&case.file);
        if let Some(stdin) = &case.stdin {
            cmd.stdin(std::fs::File::open(stdin).unwrap());
        }
        let out = cmd.output().unwrap();
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {stderr}", case.name);
        assert!(stderr.contains(&case.want), "{}: {stderr}", case.name);
    }

    // `allot submit` refuses them before it looks for a server.
    let out = allot(dir.path())
        .arg("submit")
        .arg(&huge)
        .args(["--nats", "nats://127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("nothing was submitted:\n  - the spec is 52428800 bytes"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn wait_without_a_reachable_server_fails_before_submitting_anything() {
    let dir = tempfile::tempdir().unwrap();
    let out = allot(dir.path())
        .arg("submit")
        .arg(example("train-eval.yaml"))
        .args(["--wait", "--nats", "nats://127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("nothing was submitted: NATS at nats://127.0.0.1:1")
            && text(&out.stderr).contains("is not reachable"),
        "{}",
        text(&out.stderr)
    );
}

/// What a CI job sees while no stream stores its submission — what every publish is told while
/// a clustered stream elects a new leader after losing a server: `--retry-for 1s` gives up
/// after a second, saying it may not have been submitted; by default the same message is
/// sent again until a stream stores it, and it is stored once however many attempts reached
/// the server.
#[test]
fn a_submission_no_stream_stores_yet_is_sent_again_until_one_does_and_stored_once() {
    let server = NatsServer::start();
    let url = server.url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let spec = example("train-eval.yaml");
    let command = |retry_for: Option<&str>| {
        let mut cmd = allot(dir.path());
        cmd.arg("submit")
            .arg(&spec)
            .args([
                "--run-id",
                "ci-77",
                "--nats",
                &url,
                "--submitter",
                "ci@test",
            ])
            .arg("--teams")
            .arg(example("teams.yaml"));
        if let Some(r) = retry_for {
            cmd.args(["--retry-for", r]);
        }
        cmd
    };

    let once = command(Some("1s")).output().unwrap();
    let stderr = text(&once.stderr);
    assert_eq!(once.status.code(), Some(1), "{stderr}");
    assert!(
        once.stdout.is_empty(),
        "no workload id for a failed submission"
    );
    assert!(
        stderr.contains("it may not have been submitted — running the same command again is safe")
            && stderr.contains("no stream captures subject allot.workload.submitted.vision")
            && stderr.contains(" (tried for "),
        "{stderr}"
    );

    let mut patient = crate::support::spawn_logged(command(None), dir.path(), "submit");
    let retried = crate::support::wait_for(std::time::Duration::from_secs(20), || {
        crate::support::log_of(dir.path(), "submit")
            .contains("not stored; sending it again until it is")
            .then_some(())
    });
    let log = crate::support::log_of(dir.path(), "submit");
    assert!(retried.is_some(), "the first attempt did not fail: {log}");
    // Still trying: the streams come up (as a new leader is elected) and it is stored.
    assert_eq!(patient.try_wait().unwrap(), None, "{log}");
    create_streams(&rt, &url);
    let status = crate::support::wait_exit(&mut patient, std::time::Duration::from_secs(40));
    let log = crate::support::log_of(dir.path(), "submit");
    assert!(status.is_some_and(|s| s.success()), "{status:?}: {log}");
    assert!(log.contains(": submitted (attempt "), "{log}");
    let stored = workloads(&rt, &url);
    assert_eq!(stored.len(), 1, "stored once: {stored:?}");
    let id = log.lines().last().unwrap_or_default().trim();
    let AnyEvent::Workload(WorkloadEvent::Submitted(s)) = &stored[0].2 else {
        panic!("not a submission: {:?}", stored[0]);
    };
    assert_eq!(s.workload_id, id, "{log}");
}

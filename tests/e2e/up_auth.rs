//! `allot up`'s server believes only who may speak: a client without credentials is turned away,
//! a team's credentials can submit for the team but not finish its workload, the credentials are
//! private files — and the quick start (status, submit --wait) still works, as `admin`, without
//! the user doing anything. A team's user (`ALLOT_CREDENTIALS`) submits, follows, lists and
//! aborts within its team, and is told at once when it names another.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::Duration;

use allot_bus::Credentials;

use crate::support::{allot, free_port, log_of, spawn_logged, terminate, wait_exit, wait_for};

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// Publishes `payload` on `subject` as `creds` and awaits the PubAck: `Err` if the server did
/// not acknowledge it (refused), or did not let the client in.
fn publish_as(url: &str, creds: Option<&Credentials>, subject: &str) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let options = match creds {
            Some(c) => c.connect_options(),
            None => async_nats::ConnectOptions::new(),
        };
        let client = options
            .connection_timeout(Duration::from_secs(2))
            .connect(url)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let mut js = async_nats::jetstream::new(client);
        js.set_timeout(Duration::from_secs(2));
        let payload = serde_json::json!({
            "specversion": "1.0", "id": "0192f0c4-0000-7000-8000-00000000000f",
            "source": "/forged", "type": "io.allot.workload.v1.finished",
            "time": "2025-01-01T00:00:00Z",
            "data": { "workload_id": "train-eval-0000000000", "team": "vision",
                      "outcome": "succeeded" }
        });
        js.publish(subject.to_owned(), payload.to_string().into())
            .await
            .map_err(|e| format!("publish: {e}"))?
            .await
            .map_err(|e| format!("ack: {e}"))?;
        Ok(())
    })
}

/// `allot <args>` run in `dir`, as the user of `ALLOT_CREDENTIALS=creds` (the folder's admin
/// without).
fn as_user(dir: &Path, creds: Option<&Path>, args: &[&str]) -> (Option<i32>, String, String) {
    let mut cmd = allot(dir);
    cmd.args(args);
    if let Some(creds) = creds {
        cmd.env("ALLOT_CREDENTIALS", creds);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A team's CI, logged in with the team's credentials file: it submits and follows its own
/// workloads, and is stopped before publishing anything for another team, with exit 2 and a
/// message naming the login — not a timeout.
fn team_user_works_within_its_team(dir: &Path, auth: &Path, examples: &Path) {
    let vision = auth.join("team-vision.credentials.json");
    let vision = Some(vision.as_path());
    let spec = |name: &str| examples.join(name).display().to_string();
    let (train, nlp) = (spec("train-eval.yaml"), spec("fractional.yaml"));
    let (code, nlp_id, err) = as_user(dir, None, &["submit", &nlp, "--run-id", "nlp-1"]);
    assert_eq!(code, Some(0), "{err}");
    let nlp_id = nlp_id.trim();

    // Followed to its end through the planner's answers (a team's user reads no stream).
    let (code, out, err) = as_user(
        dir,
        vision,
        &[
            "submit",
            &train,
            "--run-id",
            "vision-ci-2",
            "--follow",
            "--timeout",
            "180s",
        ],
    );
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(err.contains("as team-vision"), "{err}");
    let id = out.lines().next().unwrap();
    assert!(
        out.contains(&format!("workload {id} succeeded after")),
        "{out}"
    );
    let eval = out
        .lines()
        .find(|l| l.trim_start().starts_with("eval "))
        .unwrap_or_else(|| panic!("no summary row for eval:\n{out}"));
    assert!(
        eval.contains("task-") && eval.contains("succeeded"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.contains("] eval") && l.contains("completed")),
        "each task's state as it changes:\n{out}"
    );

    // Costs: `allot up` gives a team's login no stream to read (per-team read isolation is
    // the accounts of `allot nats-config`), and it is told so; another team's report is
    // refused at once.
    let (code, _, err) = as_user(dir, vision, &["costs"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("COSTS_vision") && err.contains("allot costs --team vision"),
        "{err}"
    );
    let (code, _, err) = as_user(dir, vision, &["costs", "--team", "nlp"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("logged in as team-vision"), "{err}");

    // Another team's spec: refused before anything is published.
    let (code, _, err) = as_user(dir, vision, &["submit", &nlp, "--run-id", "nlp-2"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("is for team nlp, but you are logged in as team-vision")
            && err.contains("nothing was submitted"),
        "{err}"
    );
    let (code, nlp_list, err) = as_user(
        dir,
        None,
        &["workloads", "--team", "nlp", "--output", "json"],
    );
    assert_eq!(code, Some(0), "{err}");
    let nlp_list: serde_json::Value = serde_json::from_str(&nlp_list).unwrap();
    assert_eq!(
        nlp_list["workloads"].as_array().unwrap().len(),
        1,
        "{nlp_list}"
    );

    // Its own list holds its team's workloads only; another team's is not revealed.
    let (code, mine, err) = as_user(dir, vision, &["workloads", "--output", "json"]);
    assert_eq!(code, Some(0), "{err}");
    let mine: serde_json::Value = serde_json::from_str(&mine).unwrap();
    let mine = mine["workloads"].as_array().unwrap();
    assert!(mine.iter().any(|w| w["id"] == id), "{mine:?}");
    assert!(mine.iter().all(|w| w["team"] == "vision"), "{mine:?}");
    let (code, _, err) = as_user(dir, vision, &["workload", nlp_id]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("no workload") && err.contains("of team vision"),
        "{err}"
    );
    let (code, _, err) = as_user(dir, vision, &["workloads", "--team", "nlp"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("logged in as team-vision"), "{err}");

    // Aborts: its team is implied and the planner refuses what it does not own; naming
    // another team is stopped here.
    let (code, _, err) = as_user(dir, vision, &["abort", nlp_id, "--reason", "mine?"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("refused"), "{err}");
    let (code, _, err) = as_user(
        dir,
        vision,
        &["abort", nlp_id, "--team", "nlp", "--reason", "mine?"],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("logged in as team-vision") && err.contains("nothing was aborted"),
        "{err}"
    );
    let (code, still, _) = as_user(dir, None, &["workload", nlp_id, "--output", "json"]);
    assert_eq!(code, Some(0));
    let still: serde_json::Value = serde_json::from_str(&still).unwrap();
    assert_ne!(still["workload"]["state"], "aborted", "{still}");
}

#[test]
fn allot_up_lets_in_only_its_users_and_the_quick_start_still_works() {
    let dir = tempfile::tempdir().unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut up = allot(dir.path());
    up.args(["up", "--sim-speedup", "3600", "--sim-nodes", "2"])
        .args(["--nats-port", &free_port().to_string()])
        .arg("--teams")
        .arg(examples.join("teams.yaml"));
    let mut up = spawn_logged(up, dir.path(), "up");
    let data = dir.path().join(".allot");
    wait_for(Duration::from_secs(60), || {
        data.join("nats.url").exists().then_some(())
    })
    .unwrap_or_else(|| panic!("allot up wrote no URL:\n{}", log_of(dir.path(), "up")));
    let url = std::fs::read_to_string(data.join("nats.url"))
        .unwrap()
        .trim()
        .to_owned();

    // The secrets are the owner's alone.
    let auth = data.join("auth");
    assert_eq!(mode(&auth), 0o700);
    for user in [
        "admin",
        "planner",
        "collector-node-1",
        "team-vision",
        "team-nlp",
    ] {
        assert_eq!(
            mode(&auth.join(format!("{user}.credentials.json"))),
            0o600,
            "{user}"
        );
    }
    assert_eq!(mode(&auth.join("nats-users.conf")), 0o600);

    // Without credentials: turned away, by a raw client and by the CLI pointed at the bare URL.
    let anonymous = publish_as(&url, None, "allot.workload.finished.vision");
    assert!(
        anonymous.as_ref().is_err_and(|e| e.starts_with("connect")),
        "{anonymous:?}"
    );
    let status = allot(dir.path())
        .args(["status", "--nats", &url])
        .output()
        .unwrap();
    assert!(!status.status.success(), "anonymous status was answered");
    let err = String::from_utf8_lossy(&status.stderr);
    assert!(err.contains("refused the login"), "{err}");
    // A wrong password is named as such, and never echoed.
    let guessed = url.replacen("nats://", "nats://admin:s3cr3t-guess@", 1);
    let status = allot(dir.path())
        .args(["status", "--nats", &guessed])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&status.stderr);
    assert!(!status.status.success());
    assert!(err.contains("refused the login"), "{err}");
    assert!(
        !err.contains("s3cr3t-guess"),
        "the password was echoed: {err}"
    );

    // A team's credentials finish nothing: WorkloadFinished is the planner's.
    let team: Credentials = serde_json::from_str(
        &std::fs::read_to_string(auth.join("team-vision.credentials.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(team.url, url);
    let forged = publish_as(&url, Some(&team), "allot.workload.finished.vision");
    assert!(
        forged.as_ref().is_err_and(|e| e.starts_with("ack")),
        "{forged:?}"
    );

    // The quick start, with no flags: the CLI logs in as admin from the data folder.
    let status = allot(dir.path()).arg("status").output().unwrap();
    assert!(
        status.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&status.stderr),
        log_of(dir.path(), "up")
    );
    let out = allot(dir.path())
        .arg("submit")
        .arg(examples.join("train-eval.yaml"))
        .arg("--teams")
        .arg(examples.join("teams.yaml"))
        .args(["--wait", "--timeout", "180s"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}\nallot up:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        log_of(dir.path(), "up")
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("succeeded after"));

    team_user_works_within_its_team(dir.path(), &auth, &examples);

    // The only refusal the server logged is the forgery above: no service lacks a right.
    let server_log = std::fs::read_to_string(data.join("nats.log")).unwrap_or_default();
    let refused: Vec<&str> = server_log
        .lines()
        .filter(|l| l.contains("Violation") && !l.contains("user:team-vision"))
        .collect();
    assert!(
        refused.is_empty(),
        "a service was refused something it needs:\n{}",
        refused.join("\n")
    );

    terminate(&up);
    assert!(
        wait_exit(&mut up, Duration::from_secs(30)).is_some_and(|s| s.success()),
        "{}",
        log_of(dir.path(), "up")
    );
}

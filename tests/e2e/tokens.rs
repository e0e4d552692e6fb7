//! Gateway tokens from the command line: an operator issues one with `allot token create`, the
//! gateway accepts it, `allot token revoke ID` takes it away, and the gateway turns it away
//! from then on. A typo in the id, or an id never issued, revokes nothing and says so.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use crate::support::{
    allot, api_get, free_port, gateway_of, log_of, spawn_logged, terminate, wait_exit, wait_for,
};

/// The HTTP status of `GET path` at the gateway `url` with `token`.
fn status_of(url: &str, token: &str, path: &str) -> Option<u16> {
    api_get(url.trim_start_matches("http://"), token, path).map(|(status, _)| status)
}

/// Whether the gateway at `url` answers `status` to `token` within 30 s; if not, what it
/// answered last (`None`: it could not be asked).
fn answers(url: &str, token: &str, status: u16) -> Result<(), Option<u16>> {
    let mut last = None;
    wait_for(Duration::from_secs(30), || {
        std::thread::sleep(Duration::from_millis(200));
        last = status_of(url, token, "/api/v1/queue");
        (last? == status).then_some(())
    })
    .ok_or(last)
}

fn run(dir: &Path, args: &[&str]) -> Output {
    allot(dir).args(args).output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_revoked_token_is_turned_away_and_a_wrong_id_revokes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut up = allot(dir.path());
    up.args(["up", "--sim-nodes", "1", "--sim-gpus", "2"])
        .args(["--nats-port", &free_port().to_string()])
        .args(["--listen", &format!("127.0.0.1:{}", free_port())]);
    let mut up = spawn_logged(up, dir.path(), "up");
    let (url, _admin) = gateway_of(dir.path(), "up");

    let issued = run(
        dir.path(),
        &["token", "create", "--team", "vision", "--role", "viewer"],
    );
    assert!(issued.status.success(), "{}", stderr(&issued));
    let token = String::from_utf8(issued.stdout.clone())
        .unwrap()
        .trim()
        .to_owned();
    // "allot: issued token <id> (viewer of team vision); …"
    let id = stderr(&issued)
        .split_whitespace()
        .skip_while(|w| *w != "token")
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    assert_eq!(id.len(), 12, "no token id in {:?}", stderr(&issued));

    if let Err(last) = answers(&url, &token, 200) {
        panic!(
            "the new token was never accepted by {url:?} (last answer: {last:?}):\n{}",
            log_of(dir.path(), "up")
        );
    }

    // Ids that are not a token's, or of no token issued: refused with exit 2, and the token
    // still works.
    for (wrong, why) in [
        ("not-an-id", "is not a token id"),
        ("0123456789ab", "no token"),
    ] {
        let out = run(dir.path(), &["token", "revoke", wrong]);
        assert_eq!(out.status.code(), Some(2), "{wrong}: {}", stderr(&out));
        assert!(stderr(&out).contains(why), "{wrong}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("nothing was revoked"),
            "{}",
            stderr(&out)
        );
    }
    assert_eq!(status_of(&url, &token, "/api/v1/queue"), Some(200));

    let revoked = run(dir.path(), &["token", "revoke", &id]);
    assert!(revoked.status.success(), "{}", stderr(&revoked));
    assert!(
        stderr(&revoked).contains("team vision"),
        "{}",
        stderr(&revoked)
    );
    if let Err(last) = answers(&url, &token, 401) {
        panic!(
            "the revoked token is still accepted by {url:?} (last answer: {last:?}):\n{}",
            log_of(dir.path(), "up")
        );
    }

    // Revoking it again changes nothing and says so.
    let again = run(dir.path(), &["token", "revoke", &id]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(
        stderr(&again).contains("already revoked"),
        "{}",
        stderr(&again)
    );

    terminate(&up);
    assert!(wait_exit(&mut up, Duration::from_secs(60)).is_some());
}

use std::time::{Duration, Instant};

use super::{RestartLimit, discover_url, team_of_url, without_credentials};

#[test]
fn restarts_are_allowed_up_to_the_limit_within_the_window_and_again_once_it_has_passed() {
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let mut limit = RestartLimit::new(2, Duration::from_secs(60));
    let got: Vec<bool> = [0, 10, 20, 59, 61, 70, 71]
        .into_iter()
        .map(|s| limit.allows(at(s)))
        .collect();
    // 0 and 10 fill the window; 20 and 59 are refused; at 61 the first has aged out, at 70 the
    // second; 71 finds the window full again (61, 70).
    assert_eq!(got, [true, true, false, false, true, true, false]);
}

#[test]
fn no_restart_is_allowed_with_a_limit_of_zero() {
    let mut limit = RestartLimit::new(0, Duration::from_secs(60));
    assert!(!limit.allows(Instant::now()));
}

#[test]
fn credentials_never_reach_the_lock_file() {
    for (url, want) in [
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
        (
            "nats://allot:s3cr@t@127.0.0.1:4222",
            "nats://127.0.0.1:4222",
        ),
        ("nats://tok@a:1,nats://b:2", "nats://a:1,nats://b:2"),
    ] {
        assert_eq!(without_credentials(url), want, "{url}");
    }
}

/// A folder where `allot up` ran: its URL and admin credentials.
fn instance_folder() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("nats.url"), "nats://127.0.0.1:4999\n").unwrap();
    std::fs::create_dir(dir.path().join("auth")).unwrap();
    let admin = serde_json::json!({"account": "", "user": "admin", "password": "adm1n",
                                   "url": "nats://127.0.0.1:4999"});
    std::fs::write(
        dir.path().join("auth/admin.credentials.json"),
        admin.to_string(),
    )
    .unwrap();
    dir
}

#[test]
fn client_commands_log_in_as_the_user_of_allot_credentials_else_as_the_folders_admin() {
    let dir = instance_folder();
    let team = dir.path().join("team-vision.credentials.json");
    let team_creds = serde_json::json!({"account": "", "user": "team-vision", "password": "v1s",
                                        "url": "nats://10.0.0.7:4222"});
    std::fs::write(&team, team_creds.to_string()).unwrap();
    let team = team.display().to_string();
    let none = |_: &str| None;
    let creds = |k: &str| (k == "ALLOT_CREDENTIALS").then(|| team.clone());
    let creds_and_url = |k: &str| match k {
        "ALLOT_CREDENTIALS" => Some(team.clone()),
        "ALLOT_NATS_URL" => Some("nats://10.0.0.8:4222".to_owned()),
        _ => None,
    };
    // The folder's instance, as its admin.
    let (url, origin) = discover_url(None, &none, dir.path()).unwrap();
    assert_eq!(url, "nats://admin:adm1n@127.0.0.1:4999");
    assert!(origin.ends_with("nats.url"), "{origin}");
    // A team's file: its user at its URL, whatever the folder holds.
    let (url, origin) = discover_url(None, &creds, dir.path()).unwrap();
    assert_eq!(url, "nats://team-vision:v1s@10.0.0.7:4222");
    assert!(
        origin.contains("as team-vision from ALLOT_CREDENTIALS"),
        "{origin}"
    );
    // A URL named beside it: that server, as the file's user.
    let (url, _) = discover_url(None, &creds_and_url, dir.path()).unwrap();
    assert_eq!(url, "nats://team-vision:v1s@10.0.0.8:4222");
    let (url, origin) = discover_url(Some("nats://10.0.0.9:4222"), &creds, dir.path()).unwrap();
    assert_eq!(url, "nats://team-vision:v1s@10.0.0.9:4222");
    assert!(origin.starts_with("--nats, as team-vision"), "{origin}");
}

#[test]
fn allot_credentials_naming_no_credentials_file_is_an_error_saying_so() {
    let dir = instance_folder();
    let missing = dir.path().join("nope.json").display().to_string();
    let env = |k: &str| (k == "ALLOT_CREDENTIALS").then(|| missing.clone());
    let err = discover_url(None, &env, dir.path()).unwrap_err();
    assert!(
        format!("{err:#}").contains("reading ALLOT_CREDENTIALS="),
        "{err:#}"
    );
    let url_file = dir.path().join("nats.url").display().to_string();
    let env = |k: &str| (k == "ALLOT_CREDENTIALS").then(|| url_file.clone());
    let err = discover_url(None, &env, dir.path()).unwrap_err();
    assert!(
        format!("{err:#}").contains("is not a credentials file"),
        "{err:#}"
    );
}

#[test]
fn a_team_user_is_read_from_the_url() {
    assert_eq!(
        team_of_url("nats://team-vision:pw@127.0.0.1:4222").as_deref(),
        Some("vision")
    );
    assert_eq!(team_of_url("nats://admin:pw@127.0.0.1:4222"), None);
    assert_eq!(team_of_url("nats://127.0.0.1:4222"), None);
}

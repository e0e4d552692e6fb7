use std::time::{Duration, Instant};

use super::{RestartLimit, without_credentials};

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

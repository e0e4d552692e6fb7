use rand::SeedableRng;
use rand::rngs::StdRng;

use super::*;

fn users(previous: &BTreeMap<String, String>) -> Users {
    Users::generate(
        &["node-1", "node-2"],
        &["vision"],
        previous,
        &mut StdRng::seed_from_u64(7),
    )
    .unwrap()
}

/// The rendered block of one user, from its `{ user: …` line to the next user's.
fn block<'a>(rendered: &'a str, user: &str) -> &'a str {
    let start = rendered
        .find(&format!("{{ user: \"{user}\""))
        .unwrap_or_else(|| panic!("no user {user} in:\n{rendered}"));
    let rest = &rendered[start + 1..];
    let end = rest.find("{ user: ").unwrap_or(rest.len());
    &rendered[start..start + 1 + end]
}

#[test]
fn one_user_per_role_with_a_distinct_password_each() {
    let users = users(&BTreeMap::new());
    let names: Vec<String> = users.iter().map(|u| u.role.user()).collect();
    assert_eq!(
        names,
        [
            "admin",
            "inventory",
            "allocator",
            "planner",
            "predictor",
            "billing",
            "archiver",
            "remediation",
            "gateway",
            "collector-node-1",
            "collector-node-2",
            "team-vision"
        ]
    );
    let passwords: BTreeSet<&str> = users.iter().map(|u| u.password.as_str()).collect();
    assert_eq!(passwords.len(), names.len());
    assert!(
        passwords
            .iter()
            .all(|p| p.len() == crate::accounts::PASSWORD_LEN)
    );
}

#[test]
fn passwords_already_handed_out_are_kept() {
    let first = users(&BTreeMap::new());
    let previous: BTreeMap<String, String> = [(
        "team-vision".to_owned(),
        first
            .get(&Role::Team("vision".into()))
            .unwrap()
            .password
            .clone(),
    )]
    .into();
    let second = Users::generate(
        &["node-1"],
        &["vision"],
        &previous,
        &mut StdRng::seed_from_u64(99),
    )
    .unwrap();
    assert_eq!(
        second.get(&Role::Team("vision".into())).unwrap().password,
        previous["team-vision"]
    );
    assert_ne!(
        second.get(&Role::Admin).unwrap().password,
        first.get(&Role::Admin).unwrap().password,
        "a user without a previous password gets a fresh one"
    );
}

#[test]
fn each_collector_may_publish_for_its_own_node_only() {
    let rendered = users(&BTreeMap::new()).render();
    let one = block(&rendered, "collector-node-1");
    for want in [
        "\"allot.node.registered.node-1\"",
        "\"allot.node.heartbeat.node-1\"",
        "\"allot.telemetry.node-1\"",
        "\"allot.task.completed.*.node-1\"",
        "\"allot.task.failed.*.node-1\"",
    ] {
        assert!(one.contains(want), "missing {want} in:\n{one}");
    }
    assert!(!one.contains("node-2"), "{one}");
    assert!(!one.contains("allot.task.ready"), "{one}");
    assert!(!one.contains("allot.alloc"), "{one}");
}

#[test]
fn stream_administration_is_denied_to_every_user_but_admin() {
    let users = users(&BTreeMap::new());
    let rendered = users.render();
    assert!(
        block(&rendered, "admin").trim_end().ends_with("}"),
        "admin has no permissions block: it may do everything"
    );
    assert!(!block(&rendered, "admin").contains("permissions"));
    for user in users.iter().filter(|u| u.role != Role::Admin) {
        let p = user.role.permissions().unwrap();
        let denied = |s: &str| p.publish_deny.iter().any(|d| d == s);
        for s in ["$JS.API.STREAM.DELETE.>", "$JS.API.STREAM.PURGE.>"] {
            assert!(
                denied(s) || user.role == Role::Team("vision".into()) && denied("$JS.>"),
                "{} may {s}",
                user.role.user()
            );
        }
        assert!(
            denied("_INBOX.>"),
            "{} may publish on _INBOX",
            user.role.user()
        );
    }
}

#[test]
fn names_that_would_widen_a_subject_are_refused() {
    let none = BTreeMap::new();
    let rng = &mut StdRng::seed_from_u64(1);
    assert!(matches!(
        Users::generate(&["node.1"], &[] as &[&str], &none, rng),
        Err(UsersError::NotAToken(_))
    ));
    assert!(matches!(
        Users::generate(&["n"], &["a", "*"], &none, rng),
        Err(UsersError::NotAToken(_))
    ));
    assert_eq!(
        Users::generate(&["n", "n"], &[] as &[&str], &none, rng),
        Err(UsersError::Duplicate {
            what: "node",
            name: "n".into()
        })
    );
}

#[test]
fn credentials_go_into_and_out_of_every_server_of_a_url() {
    assert_eq!(
        url_with_credentials("nats://127.0.0.1:4222,nats://old:pw@b:4223", "u", "p"),
        "nats://u:p@127.0.0.1:4222,nats://u:p@b:4223"
    );
    assert_eq!(
        without_credentials("nats://u:p@127.0.0.1:4222,tls://b:4223"),
        "nats://127.0.0.1:4222,tls://b:4223"
    );
}

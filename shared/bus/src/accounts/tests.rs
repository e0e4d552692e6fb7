use rand::SeedableRng;
use rand::rngs::StdRng;

use super::*;

fn rng() -> StdRng {
    StdRng::seed_from_u64(7)
}

/// The account names the rendered configuration declares (its top-level blocks).
fn declared_accounts(rendered: &str) -> Vec<String> {
    rendered
        .lines()
        .filter(|l| l.starts_with("  ") && !l.starts_with("   ") && l.ends_with(": {"))
        .map(|l| {
            l.trim()
                .trim_end_matches(": {")
                .trim_matches('"')
                .to_owned()
        })
        .collect()
}

#[test]
fn team_names_that_are_not_subject_tokens_are_rejected_with_every_problem_listed() {
    struct Case {
        name: &'static str,
        teams: &'static [&'static str],
        want_problems: &'static [&'static str],
    }
    let cases = [
        Case {
            name: "plain names are fine",
            teams: &["vision", "nlp-2", "Speech_EU"],
            want_problems: &[],
        },
        Case {
            name: "a dot would split the subject, a wildcard widen it",
            teams: &["a.b", "ok", "x*", "all>"],
            want_problems: &[
                "teams[0]: team \"a.b\" is not a valid name",
                "teams[2]: team \"x*\" is not a valid name",
                "teams[3]: team \"all>\" is not a valid name",
            ],
        },
        Case {
            name: "empty, spaced and duplicate names, all reported",
            teams: &["", "vision", "data team", "vision"],
            want_problems: &[
                "teams[0]: team \"\" is not a valid name",
                "teams[2]: team \"data team\" is not a valid name",
                "teams[3]: team \"vision\" is listed twice",
            ],
        },
    ];
    for case in cases {
        match Accounts::generate(case.teams, &mut rng()) {
            Ok(accounts) => {
                assert!(case.want_problems.is_empty(), "{}: accepted", case.name);
                assert_eq!(accounts.team_names(), case.teams, "{}", case.name);
            }
            Err(AccountsError::InvalidTeams(problems)) => {
                let got: Vec<String> = problems.iter().map(ToString::to_string).collect();
                assert_eq!(
                    got.len(),
                    case.want_problems.len(),
                    "{}: {got:#?}",
                    case.name
                );
                for (got, want) in got.iter().zip(case.want_problems) {
                    assert!(got.starts_with(want), "{}: {got:?} vs {want:?}", case.name);
                }
            }
            Err(other) => panic!("{}: {other}", case.name),
        }
    }
}

#[test]
fn no_teams_is_an_error_not_an_empty_configuration() {
    let none: [&str; 0] = [];
    assert_eq!(
        Accounts::generate(&none, &mut rng()),
        Err(AccountsError::NoTeams)
    );
}

#[test]
fn the_configuration_declares_exactly_the_platform_account_and_one_account_per_team() {
    let accounts = Accounts::generate(&["vision", "nlp"], &mut rng()).unwrap();
    for rendered in [accounts.render(), accounts.render_exports_only()] {
        assert_eq!(
            declared_accounts(&rendered),
            ["PLATFORM", "TEAM_vision", "TEAM_nlp"]
        );
        // Every password appears once, with its own user.
        for password in std::iter::once(&accounts.platform_password)
            .chain(accounts.teams.iter().map(|t| &t.password))
        {
            assert_eq!(rendered.matches(password.as_str()).count(), 1);
        }
    }
}

#[test]
fn each_user_gets_its_own_strong_password() {
    let accounts = Accounts::generate(&["a", "b", "c"], &mut StdRng::from_os_rng()).unwrap();
    let mut passwords: Vec<&String> = std::iter::once(&accounts.platform_password)
        .chain(accounts.teams.iter().map(|t| &t.password))
        .collect();
    for p in &passwords {
        assert_eq!(p.len(), PASSWORD_LEN);
        assert!(p.bytes().all(|b| b.is_ascii_alphanumeric()), "{p}");
    }
    passwords.sort();
    passwords.dedup();
    assert_eq!(passwords.len(), 4, "no two users share a password");
}

#[test]
fn a_team_sees_only_its_own_subjects_and_the_filtered_consumer_create_of_costs() {
    let accounts = Accounts::generate(&["vision", "nlp"], &mut rng()).unwrap();
    let rendered = accounts.render();
    // The only PLATFORM JetStream API a team account can reach is consumer-create on COSTS
    // carrying the team's own filter — never the plain create subject or any other API.
    assert!(rendered.contains(
        "{ service: \"$JS.API.CONSUMER.CREATE.COSTS.*.allot.cost.vision.>\", accounts: [\"TEAM_vision\"] }"
    ));
    assert!(!rendered.contains("\"$JS.API.>\""));
    assert!(!rendered.contains("\"$JS.API.CONSUMER.>\""));
    assert!(!rendered.contains("\"$JS.API.CONSUMER.CREATE.COSTS.>\""));
    // Every export of PLATFORM names the accounts that may import it: none is public.
    let platform = rendered.split("\"TEAM_vision\": {").next().unwrap();
    for line in platform
        .lines()
        .filter(|l| l.contains("{ service:") || l.contains("{ stream:"))
    {
        if line.contains("account:") {
            continue; // an import
        }
        assert!(line.contains("accounts: ["), "public export: {line}");
    }
    // No team user may publish on `allot.>`.
    assert_eq!(rendered.matches("deny: [\"allot.>\"").count(), 2);
}

#[test]
fn credentials_name_the_user_the_live_subjects_and_the_stream() {
    let accounts = Accounts::generate(&["vision"], &mut rng()).unwrap();
    let creds = accounts
        .team_credentials("vision", "nats://nats:4222")
        .unwrap();
    assert_eq!(creds.account, "TEAM_vision");
    assert_eq!(creds.user, "team-vision");
    assert_eq!(creds.live_subjects.as_deref(), Some("allot.cost.vision.>"));
    assert_eq!(creds.stream.as_deref(), Some("COSTS_vision"));
    let json = serde_json::to_string(&creds).unwrap();
    assert_eq!(serde_json::from_str::<Credentials>(&json).unwrap(), creds);
    assert_eq!(accounts.team_credentials("nlp", "nats://x"), None);
    assert_eq!(
        accounts.platform_credentials("nats://x").user,
        PLATFORM_USER
    );
}

#[test]
fn a_team_stream_sources_costs_filtered_on_the_team_through_the_platform_import() {
    let config = team_stream_config("vision", 3);
    assert_eq!(config.name, "COSTS_vision");
    assert!(config.subjects.is_empty(), "fed by its source only");
    let sources = config.sources.as_ref().unwrap();
    assert_eq!(sources.len(), 1);
    assert_eq!(sources[0].name, "COSTS");
    assert_eq!(
        sources[0].filter_subject.as_deref(),
        Some("allot.cost.vision.>")
    );
    let external = sources[0].external.as_ref().unwrap();
    assert_eq!(external.api_prefix, PLATFORM_API_PREFIX);
    assert_eq!(
        external.delivery_prefix.as_deref(),
        Some("allot.sync.cost.vision")
    );
    assert!(config.deny_delete && config.deny_purge);
    assert_eq!(config.num_replicas, 3);
    assert!(team_stream_matches(&config, &config.clone()));
    let mut elsewhere = config.clone();
    elsewhere.sources.as_mut().unwrap()[0].filter_subject = Some("allot.cost.nlp.>".into());
    assert!(!team_stream_matches(&config, &elsewhere));
}

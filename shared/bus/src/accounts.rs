//! Per-team isolation on the bus: the nats-server accounts configuration that lets each team
//! read its own cost events — and nothing else — and the team streams that go with it.
//!
//! # What a team gets
//!
//! Platform services (billing included) live in the `PLATFORM` account with full access; COSTS
//! (`allot.cost.>`) is one of its streams. Each team `T` gets an account `TEAM_T` with
//! JetStream and one user, `team-T`, who can
//!
//! - subscribe live to `allot.cost.T.>`, which PLATFORM exports to `TEAM_T` alone;
//! - read `COSTS_T`, a stream in `TEAM_T` that *sources* PLATFORM's COSTS filtered on
//!   `allot.cost.T.>`, and create, read and delete consumers on it (it holds the team's history
//!   from the first cost event, whenever the stream was created);
//!
//! and nothing else: no publishing on any subject other than its own JetStream API and acks, no
//! creating, updating or deleting streams, no use of any PLATFORM subject but the one live
//! export.
//!
//! # The hole this closes, and how
//!
//! Subject permissions check the *subject* of a JetStream API request, but a consumer's filter
//! is in the request's *payload*: a user allowed `$JS.API.CONSUMER.CREATE.COSTS` may create a
//! consumer on COSTS filtered on another team's subjects and read every one of its events. So a
//! team must never reach PLATFORM's JetStream API through a general import. Here it reaches it
//! through exactly one path, closed twice:
//!
//! 1. **Accounts.** A team user's JetStream API requests (`$JS.API.>`) go to its own account's
//!    JetStream, where the only stream is `COSTS_T`; PLATFORM's streams do not exist there.
//!    The one way into PLATFORM's API is an import of
//!    `$JS.API.CONSUMER.CREATE.COSTS.*.allot.cost.T.>`, exported by PLATFORM to `TEAM_T` only.
//!    That is the *filtered* consumer-create subject (`…CREATE.<stream>.<consumer>.<filter>`),
//!    and nats-server refuses a request whose payload filter differs from the filter in its
//!    subject. So even a client with every permission in `TEAM_T` can only create consumers
//!    on COSTS that see `allot.cost.T.>`: no consumer-info, message-get, direct-get, stream
//!    or plain consumer-create subject of PLATFORM is routable from `TEAM_T` at all.
//!    That export exists for the server itself: `COSTS_T`'s source creates its consumer on
//!    COSTS through it (nats-server 2.10+ sends a filtered source's create request on the
//!    filtered subject, under the source's `external.api` prefix), and the consumer delivers
//!    to `allot.sync.cost.T.>` and receives flow control on `$JS.FC.COSTS.>`, also exported.
//! 2. **Users.** The team user's permissions are an allow-list of its own stream's API
//!    (`…STREAM.INFO.COSTS_T`, `…CONSUMER.*.COSTS_T…`, `$JS.ACK.COSTS_T.>` …) plus an explicit
//!    deny of `allot.>` and of the imported PLATFORM subjects, so the user cannot even send a
//!    request through the import above, nor create or update a stream (it cannot point
//!    `COSTS_T` at another filter, or make a stream of its own that sources anything).
//!
//! Who creates `COSTS_T`, then? The platform operator: each team account exports the create,
//! update and info subjects of its own stream (and only those) to PLATFORM, which imports them
//! under `$JS.team.T.API`; [`ensure_team_streams`] uses that prefix with the platform
//! credentials, idempotently, like [`crate::ensure_streams`] for the catalogue.
//!
//! What remains possible, knowingly: a team's push consumer on `COSTS_T` could name a deliver
//! subject that crosses an import back into PLATFORM (`$JS.platform.API…`, `$JS.FC.COSTS…`);
//! the server would then send the team's *own* cost events there, which PLATFORM's API rejects
//! (its filter must still be the team's own). It reveals nothing and writes nothing.
//!
//! # Use
//!
//! [`Accounts::generate`] draws a random password per user; [`Accounts::render`] is the
//! `accounts { … }` block to include in the server's configuration; [`Credentials`] is what
//! each team (and the platform) is handed; [`team_stream_config`] is `COSTS_T`'s configuration.
//! `allot nats-config` writes them all.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::Duration;

use async_nats::jetstream::{
    self, ErrorCode,
    context::GetStreamErrorKind,
    stream::{Config, DiscardPolicy, External, RetentionPolicy, Source, StorageType},
};
use rand::{CryptoRng, Rng, SeedableRng, distr::Alphanumeric};
use serde::{Deserialize, Serialize};

use allot_events::subject::{self, InvalidToken, validate_token};

use crate::error::BusError;
use crate::streams::{COSTS_DUPLICATE_WINDOW, Ensured, names};

/// The platform services' account: full access, home of every catalogue stream.
pub const PLATFORM_ACCOUNT: &str = "PLATFORM";
/// The platform services' user.
pub const PLATFORM_USER: &str = "platform";
/// Where a team account sees PLATFORM's (restricted) JetStream API; a team stream's source
/// names it as its `external.api`.
pub const PLATFORM_API_PREFIX: &str = "$JS.platform.API";
/// Characters in a generated password (letters and digits: about 190 bits).
pub const PASSWORD_LEN: usize = 32;

/// The NATS account of team `team`: `TEAM_<team>`.
pub fn team_account(team: &str) -> String {
    format!("TEAM_{team}")
}

/// The user of team `team`: `team-<team>` (never equal to [`PLATFORM_USER`]).
pub fn team_user(team: &str) -> String {
    format!("team-{team}")
}

/// The team's durable stream of its own cost events, in its account: `COSTS_<team>`.
pub fn team_stream(team: &str) -> String {
    format!("{}_{team}", names::COSTS)
}

/// Where PLATFORM sees team `team`'s stream-management API (create, update and info of its
/// stream only): `$JS.team.<team>.API`.
pub fn team_api_prefix(team: &str) -> String {
    format!("$JS.team.{team}.API")
}

/// Where PLATFORM delivers the messages of `COSTS_<team>`'s source consumer:
/// `allot.sync.cost.<team>` (no stream captures `allot.sync.>`).
pub fn team_deliver_prefix(team: &str) -> String {
    format!("allot.sync.cost.{team}")
}

/// The only consumer-create subjects of PLATFORM's COSTS a team account can reach: those whose
/// filter token is the team's own subjects.
fn filtered_consumer_create(team: &str) -> String {
    format!(
        "$JS.API.CONSUMER.CREATE.{}.*.{}",
        names::COSTS,
        subject::cost_of_team(team)
    )
}

/// Flow-control replies of consumers on COSTS (`$JS.FC.<stream>.<consumer>.…`).
const COSTS_FLOW_CONTROL: &str = "$JS.FC.COSTS.>";

/// One team's problem with its name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TeamProblem {
    /// The name cannot be a subject token (it would split or widen `allot.cost.<team>.>`).
    #[error("teams[{index}]: {source}")]
    NotAToken {
        /// Its position in the list.
        index: usize,
        /// Why.
        #[source]
        source: InvalidToken,
    },
    /// The name was given before.
    #[error("teams[{index}]: team {name:?} is listed twice")]
    Duplicate {
        /// Its position in the list (the second one).
        index: usize,
        /// The name.
        name: String,
    },
}

/// Why no accounts configuration can be generated: every problem, at once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccountsError {
    /// No team is listed: there would be nothing to isolate.
    #[error("the teams file lists no teams: there are no team accounts to generate")]
    NoTeams,
    /// Some team names cannot be used.
    #[error("invalid team names:\n  - {}", list(.0))]
    InvalidTeams(Vec<TeamProblem>),
}

fn list(problems: &[TeamProblem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n  - ")
}

/// What one user needs to connect: hand it to its owner, keep it out of version control.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credentials {
    /// The NATS account (for operators; a client does not send it).
    pub account: String,
    /// User name.
    pub user: String,
    /// Password.
    pub password: String,
    /// Server URL(s), comma-separated, without credentials.
    pub url: String,
    /// For a team: the subjects it may subscribe to live (`allot.cost.<team>.>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_subjects: Option<String>,
    /// For a team: its durable stream of cost events (`COSTS_<team>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
}

impl Credentials {
    /// Client options that log in as this user.
    pub fn connect_options(&self) -> async_nats::ConnectOptions {
        async_nats::ConnectOptions::with_user_and_password(self.user.clone(), self.password.clone())
    }
}

/// One team's account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TeamAccount {
    /// The team's name, as in the teams file.
    pub team: String,
    /// Its user's name (`team-<team>`).
    pub user: String,
    /// Its user's password.
    pub password: String,
}

/// A generated accounts configuration: the platform account and one account per team.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accounts {
    /// The platform user's password.
    pub platform_password: String,
    /// The team accounts, in the order given.
    pub teams: Vec<TeamAccount>,
}

impl Accounts {
    /// Accounts for `teams`, with a fresh random password per user drawn from `rng` (pass a
    /// cryptographically secure generator seeded by the OS, e.g. `rand::rngs::StdRng::from_os_rng()`).
    ///
    /// Every name must be a subject token and appear once; all problems are reported together.
    pub fn generate<S: AsRef<str>>(
        teams: &[S],
        rng: &mut impl CryptoRng,
    ) -> Result<Self, AccountsError> {
        if teams.is_empty() {
            return Err(AccountsError::NoTeams);
        }
        let mut problems = Vec::new();
        let mut seen = BTreeSet::new();
        for (index, team) in teams.iter().enumerate() {
            let team = team.as_ref();
            if let Err(source) = validate_token("team", team) {
                problems.push(TeamProblem::NotAToken { index, source });
            } else if !seen.insert(team) {
                problems.push(TeamProblem::Duplicate {
                    index,
                    name: team.to_owned(),
                });
            }
        }
        if !problems.is_empty() {
            return Err(AccountsError::InvalidTeams(problems));
        }
        let platform_password = password(rng);
        let teams = teams
            .iter()
            .map(|team| TeamAccount {
                team: team.as_ref().to_owned(),
                user: team_user(team.as_ref()),
                password: password(rng),
            })
            .collect();
        Ok(Self {
            platform_password,
            teams,
        })
    }

    /// [`Accounts::generate`] with passwords from `StdRng` (ChaCha12) seeded by the OS.
    pub fn generate_random<S: AsRef<str>>(teams: &[S]) -> Result<Self, AccountsError> {
        Self::generate(teams, &mut rand::rngs::StdRng::from_os_rng())
    }

    /// The team names, in order.
    pub fn team_names(&self) -> Vec<&str> {
        self.teams.iter().map(|t| t.team.as_str()).collect()
    }

    /// The platform services' credentials, for servers at `url`.
    pub fn platform_credentials(&self, url: &str) -> Credentials {
        Credentials {
            account: PLATFORM_ACCOUNT.to_owned(),
            user: PLATFORM_USER.to_owned(),
            password: self.platform_password.clone(),
            url: url.to_owned(),
            live_subjects: None,
            stream: None,
        }
    }

    /// Team `team`'s credentials, for servers at `url`; `None` for a team not generated.
    pub fn team_credentials(&self, team: &str, url: &str) -> Option<Credentials> {
        let account = self.teams.iter().find(|t| t.team == team)?;
        Some(Credentials {
            account: team_account(team),
            user: account.user.clone(),
            password: account.password.clone(),
            url: url.to_owned(),
            live_subjects: Some(subject::cost_of_team(team)),
            stream: Some(team_stream(team)),
        })
    }

    /// The nats-server configuration: an `accounts { … }` block to `include` from the server's
    /// main configuration file (which keeps `listen`, `jetstream { store_dir … }` and the rest).
    pub fn render(&self) -> String {
        self.render_with(true)
    }

    /// The same configuration *without the team users' permissions*: only the account
    /// boundaries, exports and imports hold. Never deploy it; it exists so a test can show that
    /// the exports alone already keep each team to its own subjects (defence in depth).
    pub fn render_exports_only(&self) -> String {
        self.render_with(false)
    }

    fn render_with(&self, team_permissions: bool) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "# Generated by `allot nats-config`: the PLATFORM account and one account per team.\n\
             # Include it from the server's configuration (`include \"accounts.conf\"`).\n\
             # Passwords are secrets: keep this file readable by the server only."
        );
        let _ = writeln!(out, "accounts {{");
        self.render_platform(&mut out);
        for team in &self.teams {
            render_team(&mut out, team, team_permissions);
        }
        let _ = writeln!(out, "}}");
        out
    }

    fn render_platform(&self, out: &mut String) {
        let _ = writeln!(out, "  {PLATFORM_ACCOUNT}: {{");
        let _ = writeln!(out, "    jetstream: enabled");
        let _ = writeln!(out, "    users: [");
        let _ = writeln!(
            out,
            "      {{ user: {}, password: {} }}",
            quote(PLATFORM_USER),
            quote(&self.platform_password)
        );
        let _ = writeln!(out, "    ]");
        let _ = writeln!(out, "    exports: [");
        let all_teams: Vec<String> = self.teams.iter().map(|t| team_account(&t.team)).collect();
        let _ = writeln!(
            out,
            "      {{ service: {}, accounts: {} }}",
            quote(COSTS_FLOW_CONTROL),
            quote_list(&all_teams)
        );
        for team in &self.teams {
            let account = [team_account(&team.team)];
            let _ = writeln!(out, "      # team {}", team.team);
            let _ = writeln!(
                out,
                "      {{ stream: {}, accounts: {} }}",
                quote(&subject::cost_of_team(&team.team)),
                quote_list(&account)
            );
            let _ = writeln!(
                out,
                "      {{ stream: {}, accounts: {} }}",
                quote(&format!("{}.>", team_deliver_prefix(&team.team))),
                quote_list(&account)
            );
            let _ = writeln!(
                out,
                "      {{ service: {}, accounts: {} }}",
                quote(&filtered_consumer_create(&team.team)),
                quote_list(&account)
            );
        }
        let _ = writeln!(out, "    ]");
        let _ = writeln!(out, "    imports: [");
        for team in &self.teams {
            for op in TEAM_STREAM_OPS {
                let local = format!("$JS.API.STREAM.{op}.{}", team_stream(&team.team));
                let _ = writeln!(
                    out,
                    "      {{ service: {{ account: {}, subject: {} }}, to: {} }}",
                    quote(&team_account(&team.team)),
                    quote(&local),
                    quote(&local.replacen("$JS.API", &team_api_prefix(&team.team), 1))
                );
            }
        }
        let _ = writeln!(out, "    ]");
        let _ = writeln!(out, "  }}");
    }
}

/// What PLATFORM may do to a team's stream through the team's exports.
const TEAM_STREAM_OPS: [&str; 3] = ["CREATE", "UPDATE", "INFO"];

fn render_team(out: &mut String, team: &TeamAccount, permissions: bool) {
    let name = &team.team;
    let stream = team_stream(name);
    let _ = writeln!(out, "  {}: {{", quote(&team_account(name)));
    let _ = writeln!(out, "    jetstream: enabled");
    let _ = writeln!(out, "    users: [");
    let _ = write!(
        out,
        "      {{ user: {}, password: {}",
        quote(&team.user),
        quote(&team.password)
    );
    if permissions {
        let allow_publish: Vec<String> = [
            "$JS.API.INFO".to_owned(),
            "$JS.API.STREAM.NAMES".to_owned(),
            "$JS.API.STREAM.LIST".to_owned(),
            format!("$JS.API.STREAM.INFO.{stream}"),
            format!("$JS.API.STREAM.MSG.GET.{stream}"),
            format!("$JS.API.DIRECT.GET.{stream}"),
            format!("$JS.API.DIRECT.GET.{stream}.>"),
            format!("$JS.API.CONSUMER.CREATE.{stream}"),
            format!("$JS.API.CONSUMER.CREATE.{stream}.>"),
            format!("$JS.API.CONSUMER.DURABLE.CREATE.{stream}.*"),
            format!("$JS.API.CONSUMER.INFO.{stream}.*"),
            format!("$JS.API.CONSUMER.DELETE.{stream}.*"),
            format!("$JS.API.CONSUMER.NAMES.{stream}"),
            format!("$JS.API.CONSUMER.LIST.{stream}"),
            format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.*"),
            format!("$JS.ACK.{stream}.>"),
            format!("$JS.FC.{stream}.>"),
        ]
        .into();
        // Belt and braces: the allow-list already excludes these; a deny wins over any allow
        // a later edit might add.
        let deny_publish: Vec<String> = [
            "allot.>".to_owned(),
            format!("{}.>", PLATFORM_API_PREFIX.trim_end_matches(".API")),
            COSTS_FLOW_CONTROL.to_owned(),
        ]
        .into();
        let allow_subscribe = [subject::cost_of_team(name), "_INBOX.>".to_owned()];
        let _ = writeln!(out, ", permissions: {{");
        let _ = writeln!(
            out,
            "        publish: {{ allow: {}, deny: {} }}",
            quote_list(&allow_publish),
            quote_list(&deny_publish)
        );
        let _ = writeln!(
            out,
            "        subscribe: {{ allow: {}, deny: {} }}",
            quote_list(&allow_subscribe),
            quote_list(&["allot.sync.>".to_owned()])
        );
        let _ = writeln!(out, "      }} }}");
    } else {
        let _ = writeln!(out, " }}");
    }
    let _ = writeln!(out, "    ]");
    let _ = writeln!(out, "    exports: [");
    for op in TEAM_STREAM_OPS {
        let _ = writeln!(
            out,
            "      {{ service: {}, accounts: {} }}",
            quote(&format!("$JS.API.STREAM.{op}.{stream}")),
            quote_list(&[PLATFORM_ACCOUNT.to_owned()])
        );
    }
    let _ = writeln!(out, "    ]");
    let _ = writeln!(out, "    imports: [");
    let platform = quote(PLATFORM_ACCOUNT);
    let _ = writeln!(
        out,
        "      {{ stream: {{ account: {platform}, subject: {} }} }}",
        quote(&subject::cost_of_team(name))
    );
    let _ = writeln!(
        out,
        "      {{ stream: {{ account: {platform}, subject: {} }} }}",
        quote(&format!("{}.>", team_deliver_prefix(name)))
    );
    let create = filtered_consumer_create(name);
    let _ = writeln!(
        out,
        "      {{ service: {{ account: {platform}, subject: {} }}, to: {} }}",
        quote(&create),
        quote(&create.replacen("$JS.API", PLATFORM_API_PREFIX, 1))
    );
    let _ = writeln!(
        out,
        "      {{ service: {{ account: {platform}, subject: {} }} }}",
        quote(COSTS_FLOW_CONTROL)
    );
    let _ = writeln!(out, "    ]");
    let _ = writeln!(out, "  }}");
}

pub(crate) fn password(rng: &mut impl CryptoRng) -> String {
    (0..PASSWORD_LEN)
        .map(|_| char::from(rng.sample(Alphanumeric)))
        .collect()
}

/// A double-quoted nats-server config string (quoted, `$` is not a variable reference).
pub(crate) fn quote(value: &str) -> String {
    format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
}

pub(crate) fn quote_list(values: &[String]) -> String {
    let quoted: Vec<String> = values.iter().map(|v| quote(v)).collect();
    format!("[{}]", quoted.join(", "))
}

/// `COSTS_<team>`'s configuration, in the team's account: it sources PLATFORM's COSTS filtered on
/// `allot.cost.<team>.>` through the team's restricted import, keeps everything (file storage,
/// no age limit) and, like COSTS, can be neither purged nor have messages deleted.
pub fn team_stream_config(team: &str, replicas: usize) -> Config {
    Config {
        name: team_stream(team),
        description: Some(format!(
            "Team {team}'s cost events, sourced from {PLATFORM_ACCOUNT}'s {} on {}",
            names::COSTS,
            subject::cost_of_team(team)
        )),
        subjects: Vec::new(),
        sources: Some(vec![Source {
            name: names::COSTS.to_owned(),
            filter_subject: Some(subject::cost_of_team(team)),
            external: Some(External {
                api_prefix: PLATFORM_API_PREFIX.to_owned(),
                delivery_prefix: Some(team_deliver_prefix(team)),
            }),
            ..Source::default()
        }]),
        retention: RetentionPolicy::Limits,
        storage: StorageType::File,
        num_replicas: replicas,
        max_messages: -1,
        max_bytes: -1,
        max_messages_per_subject: -1,
        discard: DiscardPolicy::Old,
        deny_delete: true,
        deny_purge: true,
        duplicate_window: COSTS_DUPLICATE_WINDOW,
        allow_direct: true,
        ..Config::default()
    }
}

/// Whether a running team stream matches its wanted configuration in every field we manage.
fn team_stream_matches(want: &Config, current: &Config) -> bool {
    let source = |c: &Config| {
        c.sources
            .iter()
            .flatten()
            .map(|s| {
                (
                    s.name.clone(),
                    s.filter_subject.clone(),
                    s.external
                        .as_ref()
                        .map(|e| (e.api_prefix.clone(), e.delivery_prefix.clone())),
                )
            })
            .collect::<Vec<_>>()
    };
    source(want) == source(current)
        && current.subjects.is_empty()
        && current.description == want.description
        && current.storage == want.storage
        && current.num_replicas == want.num_replicas
        && current.max_age == want.max_age
        && current.deny_delete == want.deny_delete
        && current.deny_purge == want.deny_purge
        && current.duplicate_window == want.duplicate_window
}

/// How long [`ensure_team_streams`] waits for each answer from a team account.
const TEAM_API_TIMEOUT: Duration = Duration::from_secs(5);

/// Creates each team's `COSTS_<team>` in its account, or updates it back to its configuration,
/// over `platform` — a connection as the platform user, which reaches each team's stream API
/// through the team's export. Idempotent; run it after every `allot nats-config` (new teams).
///
/// PLATFORM's COSTS stream should exist first ([`crate::ensure_streams`] with the catalogue);
/// a team stream created before it simply starts sourcing once it appears.
pub async fn ensure_team_streams<S: AsRef<str>>(
    platform: &async_nats::Client,
    teams: &[S],
    replicas: usize,
) -> Result<Vec<(String, Ensured)>, BusError> {
    let mut out = Vec::with_capacity(teams.len());
    for team in teams {
        let team = team.as_ref();
        let want = team_stream_config(team, replicas);
        let name = want.name.clone();
        let mut js = jetstream::with_prefix(platform.clone(), &team_api_prefix(team));
        js.set_timeout(TEAM_API_TIMEOUT);
        let outcome = match js.get_stream(&name).await {
            Ok(stream) => {
                if team_stream_matches(&want, &stream.cached_info().config) {
                    Ensured::Unchanged
                } else {
                    js.update_stream(want)
                        .await
                        .map_err(|e| BusError::jetstream("updating team stream", &name, e))?;
                    tracing::info!(stream = %name, team, "team stream configuration updated");
                    Ensured::Updated
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    GetStreamErrorKind::JetStream(ref err)
                        if err.error_code() == ErrorCode::STREAM_NOT_FOUND
                ) =>
            {
                js.create_stream(want)
                    .await
                    .map_err(|e| BusError::jetstream("creating team stream", &name, e))?;
                tracing::info!(stream = %name, team, "team stream created");
                Ensured::Created
            }
            Err(e) => return Err(BusError::jetstream("reading team stream", &name, e)),
        };
        out.push((name, outcome));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;

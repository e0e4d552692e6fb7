//! Who may speak on the bus: one NATS user per role, each allowed to publish only the subjects
//! that role owns, enforced by the server (the `authorization { users = [...] }` block that
//! `allot up` gives its nats-server).
//!
//! # Why the server, and why per subject
//!
//! Every Allot service believes the events it consumes: a `TaskCompleted` ends a task and runs
//! its successors, a `WorkloadFinished` ends `allot submit --wait`, a journal entry makes an
//! executor run a command. So the subjects name who speaks — a node's events carry its node,
//! a submission its team — and each user may publish on its own subjects only:
//!
//! | user | publishes |
//! |---|---|
//! | `collector-<node>` | `allot.node.{registered,heartbeat}.<node>`, `allot.telemetry.<node>`, `allot.task.{started,checkpointed,completed,failed,stopped}.*.<node>` |
//! | `allocator` | `allot.alloc.*.journal`, its lease bucket (`$KV.allot-leases.>`, creating `KV_allot-leases`) |
//! | `planner` | `allot.task.{ready,preload,cancelled}.*`, `allot.workload.{finished,abort_answered}.*`, replies to the workload queries it receives |
//! | `inventory` | `allot.inventory.>`, replies to the status queries it receives |
//! | `predictor` | `allot.task.predicted.*` |
//! | `billing` | `allot.cost.>` |
//! | `remediation` | `allot.remediation.action_taken.*` (operators' cordons are `admin`'s) |
//! | `archiver` | nothing of its own |
//! | `team-<team>` | `allot.workload.{submitted,aborted}.<team>`, inventory status queries, the planner's queries about its own team (`allot.query.planner.*.<team>`) |
//! | `admin` | everything (creates the streams; the operator's CLI) |
//!
//! Every service user may also dead-letter (`allot.deadletter.>`) and use the JetStream API its
//! consumers need — consumers, stream info, message get, acks and flow control — but never
//! create, update, delete or purge a stream or delete a message (explicitly denied, so no later
//! allow can grant it). Nobody but `admin` may publish on `_INBOX.>`: a user that could would
//! be able to answer another client's request or forge the PubAck of its publish. The inventory
//! and the planner answer their queries through `allow_responses` instead (a reply to a request
//! it received).
//!
//! What stays open, knowingly: reading. Subscriptions and consumers are not restricted for
//! service users (per-team read isolation is [`crate::accounts`]' job), and a service user's
//! `$JS.ACK.>` and `$JS.API.CONSUMER.>` rights let it disturb another service's consumer
//! (acknowledge or delete it) — a denial of service, not a forged event.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use rand::{CryptoRng, SeedableRng};

use allot_events::subject::{self, InvalidToken, validate_token};

use crate::accounts::{Credentials, password, quote, quote_list};

/// The account the users live in: the server's global account (`allot up`'s streams were always
/// there; a data folder from before authentication keeps its history).
pub const ACCOUNT: &str = "$G";
/// The user that may do everything.
pub const ADMIN_USER: &str = "admin";
/// The allocator's lease bucket (`allot_allocator::lease::BUCKET`).
pub const LEASE_BUCKET: &str = "allot-leases";

/// The task events a collector reports about runs on its node.
const NODE_TASK_EVENTS: [&str; 5] = ["started", "checkpointed", "completed", "failed", "stopped"];
/// The task events the planner publishes.
const PLANNER_TASK_EVENTS: [&str; 3] = ["ready", "preload", "cancelled"];

/// What a service user may use of the JetStream API: its consumers and reading.
const CONSUMER_API: [&str; 10] = [
    "$JS.API.INFO",
    "$JS.API.STREAM.NAMES",
    "$JS.API.STREAM.LIST",
    "$JS.API.STREAM.INFO.>",
    "$JS.API.STREAM.MSG.GET.>",
    "$JS.API.DIRECT.GET.>",
    "$JS.API.CONSUMER.>",
    "$JS.ACK.>",
    "$JS.FC.>",
    "allot.deadletter.>",
];

/// What only `admin` may do to streams, denied outright to everyone else. Stream creation is
/// denied too, except to the allocator, whose allow-list names its own lease bucket only.
const STREAM_ADMIN: [&str; 11] = [
    "$JS.API.STREAM.UPDATE.>",
    "$JS.API.STREAM.DELETE.>",
    "$JS.API.STREAM.PURGE.>",
    "$JS.API.STREAM.MSG.DELETE.>",
    "$JS.API.STREAM.SNAPSHOT.>",
    "$JS.API.STREAM.RESTORE.>",
    "$JS.API.STREAM.LEADER.>",
    "$JS.API.STREAM.PEER.>",
    "$JS.API.META.>",
    "$JS.API.ACCOUNT.>",
    "$JS.API.SERVER.>",
];
const STREAM_CREATE: &str = "$JS.API.STREAM.CREATE.>";
/// Replies to requests: nobody but `admin` publishes there directly.
const INBOX: &str = "_INBOX.>";

/// Who a user is, and so what it may publish.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Everything: creates the streams, and the operator's CLI uses it.
    Admin,
    /// The inventory service.
    Inventory,
    /// The allocator (every pool's).
    Allocator,
    /// The planner.
    Planner,
    /// The run-time predictor.
    Predictor,
    /// Billing.
    Billing,
    /// The audit archiver.
    Archiver,
    /// The remediation service.
    Remediation,
    /// The gateway: submits and aborts for any team, on behalf of the API caller it has
    /// authorised, and issues tokens.
    Gateway,
    /// The collector of one node.
    Collector(String),
    /// One team's submitters.
    Team(String),
}

impl Role {
    /// The user's name: `admin`, `allocator` …, `collector-<node>`, `team-<team>`.
    pub fn user(&self) -> String {
        match self {
            Self::Admin => ADMIN_USER.to_owned(),
            Self::Inventory => "inventory".to_owned(),
            Self::Allocator => "allocator".to_owned(),
            Self::Planner => "planner".to_owned(),
            Self::Predictor => "predictor".to_owned(),
            Self::Billing => "billing".to_owned(),
            Self::Archiver => "archiver".to_owned(),
            Self::Remediation => "remediation".to_owned(),
            Self::Gateway => "gateway".to_owned(),
            Self::Collector(node) => format!("collector-{node}"),
            Self::Team(team) => crate::accounts::team_user(team),
        }
    }

    /// What the user may do; `None` for `admin`, who may do everything.
    pub fn permissions(&self) -> Option<Permissions> {
        let service = |own: Vec<String>| Permissions {
            publish_allow: own
                .into_iter()
                .chain(CONSUMER_API.iter().map(|s| (*s).to_owned()))
                .collect(),
            publish_deny: STREAM_ADMIN
                .iter()
                .map(|s| (*s).to_owned())
                .chain([STREAM_CREATE.to_owned(), INBOX.to_owned()])
                .collect(),
            subscribe_allow: Vec::new(),
            allow_responses: false,
        };
        Some(match self {
            Self::Admin => return None,
            Self::Inventory => Permissions {
                allow_responses: true,
                ..service(vec![subject::INVENTORY_ALL.to_owned()])
            },
            Self::Allocator => {
                let mut p = service(vec![
                    subject::alloc_journal("*"),
                    format!("$KV.{LEASE_BUCKET}.>"),
                    format!("$JS.API.STREAM.CREATE.KV_{LEASE_BUCKET}"),
                ]);
                p.publish_deny.retain(|s| s != STREAM_CREATE);
                p
            }
            Self::Planner => Permissions {
                // It answers `allot workloads` and `allot workload ID`.
                allow_responses: true,
                ..service(
                    PLANNER_TASK_EVENTS
                        .iter()
                        .map(|e| subject::task(e, "*"))
                        .chain([
                            subject::workload_finished("*"),
                            subject::workload_abort_answered("*"),
                        ])
                        .collect(),
                )
            },
            Self::Predictor => service(vec![subject::task("predicted", "*")]),
            Self::Billing => service(vec![subject::COST_ALL.to_owned()]),
            Self::Archiver => service(Vec::new()),
            Self::Remediation => service(vec![subject::remediation("action_taken", "*")]),
            Self::Gateway => service(vec![
                subject::workload_submitted("*"),
                subject::workload_aborted("*"),
                subject::ACCESS_ALL.to_owned(),
            ]),
            Self::Collector(node) => service(
                [
                    subject::node_registered(node),
                    subject::node_heartbeat(node),
                    subject::telemetry(node),
                ]
                .into_iter()
                .chain(
                    NODE_TASK_EVENTS
                        .iter()
                        .map(|e| subject::task_on_node(e, "*", node)),
                )
                .collect(),
            ),
            Self::Team(team) => Permissions {
                publish_allow: vec![
                    subject::workload_submitted(team),
                    subject::workload_aborted(team),
                    // Read-only: `allot submit` checks a spec against the live inventory.
                    format!("{}.>", subject::INVENTORY_QUERY),
                    // Its own workloads only: the planner answers about the team its
                    // subject names (`allot_events::query::planner`).
                    format!("{}.*.{team}", subject::PLANNER_QUERY),
                ],
                publish_deny: vec!["$JS.>".to_owned(), "$KV.>".to_owned(), INBOX.to_owned()],
                // Its PubAcks and query answers, and the planner's answers to its own aborts;
                // nothing else of the bus.
                subscribe_allow: vec![INBOX.to_owned(), subject::workload_abort_answered(team)],
                allow_responses: false,
            },
        })
    }
}

/// What one user may do; a deny always wins over an allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permissions {
    /// Subjects it may publish on.
    pub publish_allow: Vec<String>,
    /// Subjects it may never publish on.
    pub publish_deny: Vec<String>,
    /// Subjects it may subscribe to (empty: any).
    pub subscribe_allow: Vec<String>,
    /// It may answer a request it received (once), whatever the reply subject.
    pub allow_responses: bool,
}

/// One generated user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// Its role.
    pub role: Role,
    /// Its password.
    pub password: String,
}

/// Why no users can be generated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsersError {
    /// A node or team name cannot be a subject token (it would split or widen its subjects).
    #[error(transparent)]
    NotAToken(#[from] InvalidToken),
    /// A node or team is named twice.
    #[error("{what} {name:?} is listed twice")]
    Duplicate {
        /// `node` or `team`.
        what: &'static str,
        /// The name.
        name: String,
    },
}

/// The users of one bus: `admin`, every service, one collector per node and one user per team.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Users {
    users: Vec<User>,
}

impl Users {
    /// Users for the services, `nodes`' collectors and `teams`, each with the password it had
    /// in `previous` (user name → password: clients already holding credentials keep working)
    /// or a fresh random one from `rng` (a cryptographically secure generator).
    pub fn generate<N: AsRef<str>, T: AsRef<str>>(
        nodes: &[N],
        teams: &[T],
        previous: &BTreeMap<String, String>,
        rng: &mut impl CryptoRng,
    ) -> Result<Self, UsersError> {
        let mut roles = vec![
            Role::Admin,
            Role::Inventory,
            Role::Allocator,
            Role::Planner,
            Role::Predictor,
            Role::Billing,
            Role::Archiver,
            Role::Remediation,
            Role::Gateway,
        ];
        roles.extend(named("node", nodes)?.into_iter().map(Role::Collector));
        roles.extend(named("team", teams)?.into_iter().map(Role::Team));
        let users = roles
            .into_iter()
            .map(|role| {
                let password = previous
                    .get(&role.user())
                    .filter(|p| !p.is_empty())
                    .cloned()
                    .unwrap_or_else(|| password(rng));
                User { role, password }
            })
            .collect();
        Ok(Self { users })
    }

    /// [`Users::generate`] with passwords from `StdRng` (ChaCha12) seeded by the OS.
    pub fn generate_random<N: AsRef<str>, T: AsRef<str>>(
        nodes: &[N],
        teams: &[T],
        previous: &BTreeMap<String, String>,
    ) -> Result<Self, UsersError> {
        Self::generate(
            nodes,
            teams,
            previous,
            &mut rand::rngs::StdRng::from_os_rng(),
        )
    }

    /// Every user, `admin` and the services first.
    pub fn iter(&self) -> impl Iterator<Item = &User> {
        self.users.iter()
    }

    /// The user of `role`, if generated.
    pub fn get(&self, role: &Role) -> Option<&User> {
        self.users.iter().find(|u| &u.role == role)
    }

    /// `role`'s credentials for servers at `url` (without credentials); `None` for a role not
    /// generated.
    pub fn credentials(&self, role: &Role, url: &str) -> Option<Credentials> {
        let user = self.get(role)?;
        Some(Credentials {
            account: ACCOUNT.to_owned(),
            user: role.user(),
            password: user.password.clone(),
            url: url.to_owned(),
            live_subjects: None,
            stream: None,
        })
    }

    /// `url` with `role`'s user and password in it (`nats://user:password@host:port`, for each
    /// server of a list), as services take it; `None` for a role not generated.
    pub fn url_for(&self, role: &Role, url: &str) -> Option<String> {
        let user = self.get(role)?;
        Some(url_with_credentials(url, &role.user(), &user.password))
    }

    /// The nats-server configuration: an `authorization { users = [...] }` block to include in
    /// (or append to) the server's configuration. It holds the passwords: keep it private.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "# Generated by `allot up`: one user per role, each publishing only its own subjects.\n\
             # Passwords are secrets: keep this file readable by the server only."
        );
        let _ = writeln!(out, "authorization {{");
        let _ = writeln!(out, "  users = [");
        for user in &self.users {
            let _ = write!(
                out,
                "    {{ user: {}, password: {}",
                quote(&user.role.user()),
                quote(&user.password)
            );
            match user.role.permissions() {
                None => {
                    let _ = writeln!(out, " }}");
                }
                Some(p) => {
                    let _ = writeln!(out, ", permissions: {{");
                    let _ = writeln!(
                        out,
                        "        publish: {{ allow: {}, deny: {} }}",
                        quote_list(&p.publish_allow),
                        quote_list(&p.publish_deny)
                    );
                    if !p.subscribe_allow.is_empty() {
                        let _ = writeln!(
                            out,
                            "        subscribe: {{ allow: {} }}",
                            quote_list(&p.subscribe_allow)
                        );
                    }
                    if p.allow_responses {
                        let _ = writeln!(out, "        allow_responses: true");
                    }
                    let _ = writeln!(out, "      }} }}");
                }
            }
        }
        let _ = writeln!(out, "  ]");
        let _ = writeln!(out, "}}");
        out
    }
}

/// Checks that every name is a subject token and appears once.
fn named<S: AsRef<str>>(what: &'static str, names: &[S]) -> Result<Vec<String>, UsersError> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let name = name.as_ref();
        validate_token(what, name)?;
        if !seen.insert(name) {
            return Err(UsersError::Duplicate {
                what,
                name: name.to_owned(),
            });
        }
        out.push(name.to_owned());
    }
    Ok(out)
}

/// `url` (one server or a comma-separated list) with `user:password@` in each server's address.
/// Passwords generated here are letters and digits, so nothing needs escaping.
pub fn url_with_credentials(url: &str, user: &str, password: &str) -> String {
    crate::connect::server_list(url)
        .into_iter()
        .map(|server| {
            let (scheme, rest) = server.split_once("://").unwrap_or(("nats", server));
            let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
            format!("{scheme}://{user}:{password}@{host}")
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `url` without the credentials written in it, for messages and logs.
pub fn without_credentials(url: &str) -> String {
    crate::connect::server_list(url)
        .into_iter()
        .map(|server| match server.split_once("://") {
            Some((scheme, rest)) => {
                let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
                format!("{scheme}://{host}")
            }
            None => server
                .rsplit_once('@')
                .map_or(server, |(_, h)| h)
                .to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests;

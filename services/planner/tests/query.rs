//! The planner's query endpoint against a real nats-server with `allot up`'s users: what
//! `allot workloads` and `allot workload ID` are answered — filters, newest first, a cursor,
//! where each task ran — and that a team's user sees its own team's workloads only.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use async_nats::jetstream;
use serde::de::DeserializeOwned;

use allot_allocator::journal;
use allot_bus::Publisher;
use allot_bus::users::{Role, Users};
use allot_events::query::planner::{
    self as contract, WorkloadDetail, WorkloadList, WorkloadQuery, WorkloadState, WorkloadsQuery,
};
use allot_events::task::{TaskCompleted, TaskFailed};
use allot_events::{AllocEvent, TaskEvent};
use allot_testkit::NatsServer;
use allot_workload::{Context, Format};

use common::{POOL, Stack};

/// Two stages: CPU preparation, then one GPU.
const VISION_PIPELINE: &str = r#"
apiVersion: allot/v1
kind: Workload
metadata: {name: pipeline, team: vision}
spec:
  tasks:
    - name: prep
      resources: {cpu: "1"}
      command: [python, prep.py]
    - name: train
      resources: {gpus: 2}
      command: [python, train.py]
      after: [prep]
"#;

/// One GPU task that keeps running.
const VISION_LONG: &str = r#"
apiVersion: allot/v1
kind: Workload
metadata: {name: long, team: vision}
spec:
  tasks:
    - name: serve
      resources: {gpus: 1}
      command: [python, serve.py]
"#;

/// One task that fails, never retried.
const NLP_BROKEN: &str = r#"
apiVersion: allot/v1
kind: Workload
metadata: {name: broken, team: nlp}
spec:
  tasks:
    - name: tokenize
      resources: {cpu: "1"}
      command: [python, tok.py]
"#;

/// What the fake executor does with each task (by name) it is granted.
fn outcome(name: &str) -> Option<bool> {
    match name {
        "prep" | "train" => Some(true),
        "tokenize" => Some(false),
        _ => None,
    }
}

struct Cluster {
    server: NatsServer,
    users: Users,
    stack: Stack,
}

impl Cluster {
    /// nats-server with the users of teams `vision` and `nlp`, one 4-GPU node, the allocator
    /// and the planner (each logged in as its own user), and a fake executor.
    fn start() -> Cluster {
        let users =
            Users::generate_random::<&str, _>(&[], &["vision", "nlp"], &BTreeMap::new()).unwrap();
        let server = NatsServer::start_with_config(&users.render());
        let url = server.url();
        let stack = Stack::start(
            |role| users.url_for(role, &url).unwrap(),
            allot_planner::Config::new(&url, ".").capacity_settle,
        );
        stack
            .rt
            .spawn(executor(stack.js.clone(), stack.publisher.clone()));
        Cluster {
            server,
            users,
            stack,
        }
    }

    /// Submits `spec` as `allot submit` would, from CI run `run`; returns its id.
    fn submit(&self, spec: &str, run: &str) -> String {
        let workload = allot_workload::check(spec, Format::Yaml, Context::default())
            .expect("a valid spec")
            .workload;
        self.stack.submit(workload, Some(run))
    }

    /// A client logged in as `role`.
    fn login(&self, role: &Role) -> async_nats::Client {
        let url = self.users.url_for(role, &self.server.url()).unwrap();
        self.stack.rt.block_on(async {
            allot_bus::connect::with_url_credentials(async_nats::ConnectOptions::new(), &url)
                .connect(self.server.url())
                .await
                .unwrap()
        })
    }

    /// Asks `subject` with `body`: the answer, or the error's code and text (0: no answer).
    fn ask<T: DeserializeOwned>(
        &self,
        client: &async_nats::Client,
        subject: &str,
        body: &impl serde::Serialize,
    ) -> Result<T, (usize, String)> {
        let body = serde_json::to_vec(body).unwrap();
        let reply = self.stack.rt.block_on(async {
            tokio::time::timeout(
                Duration::from_secs(2),
                client.request(subject.to_owned(), body.into()),
            )
            .await
        });
        let reply = match reply {
            Ok(Ok(reply)) => reply,
            Ok(Err(e)) => return Err((0, e.to_string())),
            Err(_) => return Err((0, "no answer within 2 s".into())),
        };
        if let Some(headers) = &reply.headers
            && let Some(error) = headers.get("Nats-Service-Error")
        {
            let code = headers
                .get("Nats-Service-Error-Code")
                .and_then(|c| c.as_str().parse().ok())
                .unwrap_or(0);
            return Err((code, error.to_string()));
        }
        Ok(serde_json::from_slice(&reply.payload).unwrap())
    }

    /// Polls `check` for up to 30 s.
    fn until<T>(&self, what: &str, check: impl Fn() -> Option<T>) -> T {
        common::until(check).unwrap_or_else(|| panic!("timed out waiting for {what}"))
    }
}

/// Completes or fails every granted run as [`outcome`] says (by task name), as a node's
/// collector would report it; keeps the others running.
async fn executor(js: jetstream::Context, publisher: Publisher) {
    let mut seen = BTreeSet::new();
    loop {
        for (_, event) in journal::read(&js, POOL).await.unwrap() {
            let AllocEvent::Applied(applied) = event else {
                continue;
            };
            for d in &applied.dispatch {
                let Some(ok) = outcome(&d.launch.name) else {
                    continue;
                };
                if !seen.insert((d.task, d.lease)) {
                    continue;
                }
                let event = if ok {
                    TaskEvent::Completed(TaskCompleted {
                        pool: POOL.into(),
                        task: d.task,
                        node: "n1".into(),
                        lease: d.lease,
                    })
                } else {
                    TaskEvent::Failed(TaskFailed {
                        pool: POOL.into(),
                        task: d.task,
                        node: "n1".into(),
                        lease: d.lease,
                        reason: "exit status 3".into(),
                    })
                };
                publisher.publish(event).await.unwrap();
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn ids(list: &WorkloadList) -> Vec<&str> {
    list.workloads.iter().map(|w| w.id.as_str()).collect()
}

#[test]
fn workloads_are_listed_newest_first_with_filters_and_shown_with_where_each_task_ran() {
    let c = Cluster::start();
    let pipeline = c.submit(VISION_PIPELINE, "run-1");
    let long = c.submit(VISION_LONG, "run-2");
    let broken = c.submit(NLP_BROKEN, "run-3");
    let admin = c.login(&Role::Admin);
    let all = contract::workloads_subject(None);
    let by_state = |state| WorkloadsQuery {
        state: Some(state),
        ..WorkloadsQuery::default()
    };
    // Until the pipeline succeeded, the nlp workload failed and the long one runs its task.
    c.until("every workload to settle", || {
        let list: WorkloadList = c.ask(&admin, &all, &WorkloadsQuery::default()).ok()?;
        let states: Vec<(WorkloadState, u32)> = list
            .workloads
            .iter()
            .map(|w| (w.state, w.tasks.running))
            .collect();
        (states
            == [
                (WorkloadState::Failed, 0),
                (WorkloadState::Running, 1),
                (WorkloadState::Succeeded, 0),
            ])
        .then_some(())
    });

    let list: WorkloadList = c.ask(&admin, &all, &WorkloadsQuery::default()).unwrap();
    assert_eq!(ids(&list), [&broken, &long, &pipeline]);
    assert_eq!(list.next_cursor, None);
    let first = &list.workloads[0];
    assert_eq!(
        (
            first.team.as_str(),
            first.submitter.as_str(),
            first.run_id.as_deref()
        ),
        ("nlp", "ci@test", Some("run-3"))
    );
    assert!(first.reason.as_deref().unwrap().contains("exit status 3"));
    assert!(first.submitted_at.is_some());

    for (query, want) in [
        (by_state(WorkloadState::Running), vec![&long]),
        (by_state(WorkloadState::Succeeded), vec![&pipeline]),
        (by_state(WorkloadState::Failed), vec![&broken]),
        (by_state(WorkloadState::Aborted), vec![]),
        (
            WorkloadsQuery {
                team: Some("vision".into()),
                ..WorkloadsQuery::default()
            },
            vec![&long, &pipeline],
        ),
        (
            WorkloadsQuery {
                since: Some(chrono::Utc::now() + chrono::Duration::hours(1)),
                ..WorkloadsQuery::default()
            },
            vec![],
        ),
    ] {
        let list: WorkloadList = c.ask(&admin, &all, &query).unwrap();
        assert_eq!(ids(&list), want, "{query:?}");
    }

    // Two at a time, then the rest after the cursor.
    let page = |cursor| WorkloadsQuery {
        limit: Some(2),
        cursor,
        ..WorkloadsQuery::default()
    };
    let one: WorkloadList = c.ask(&admin, &all, &page(None)).unwrap();
    assert_eq!(ids(&one), [&broken, &long]);
    let two: WorkloadList = c.ask(&admin, &all, &page(one.next_cursor.clone())).unwrap();
    assert_eq!(
        (ids(&two), two.next_cursor.as_deref()),
        (vec![pipeline.as_str()], None)
    );
    let refused: Result<WorkloadList, _> = c.ask(
        &admin,
        &all,
        &WorkloadsQuery {
            limit: Some(0),
            ..WorkloadsQuery::default()
        },
    );
    assert_eq!(refused.unwrap_err().0, contract::BAD_REQUEST);

    // One workload: its tasks in the spec's order, where each ran and when.
    let one = contract::workload_subject(None);
    let detail: WorkloadDetail = c
        .ask(
            &admin,
            &one,
            &WorkloadQuery {
                id: pipeline.clone(),
            },
        )
        .unwrap();
    assert_eq!(detail.workload.state, WorkloadState::Succeeded);
    let tasks: Vec<String> = detail
        .tasks
        .iter()
        .map(|t| {
            let nodes: Vec<String> = t
                .nodes
                .iter()
                .map(|n| {
                    format!(
                        "{}{:?}",
                        n.node,
                        n.gpus.iter().map(|g| g.milli).collect::<Vec<_>>()
                    )
                })
                .collect();
            format!(
                "{} {} {}/{} {}",
                t.name,
                t.state,
                t.attempt,
                t.max_attempts,
                nodes.join(",")
            )
        })
        .collect();
    assert_eq!(
        tasks,
        [
            "prep succeeded 1/1 n1[]",
            "train succeeded 1/1 n1[1000, 1000]"
        ]
    );
    for t in &detail.tasks {
        let (start, end) = (t.started_at.unwrap(), t.ended_at.unwrap());
        assert!(start <= end, "{t:?}");
    }
    let running: WorkloadDetail = c
        .ask(&admin, &one, &WorkloadQuery { id: long.clone() })
        .unwrap();
    let serve = &running.tasks[0];
    assert_eq!(
        (serve.state.as_str(), serve.nodes.len(), serve.ended_at),
        ("running", 1, None)
    );
    let missing: Result<WorkloadDetail, _> = c.ask(
        &admin,
        &one,
        &WorkloadQuery {
            id: "nothing-0000000000".into(),
        },
    );
    assert_eq!(missing.unwrap_err().0, contract::NOT_FOUND);
}

#[test]
fn a_team_sees_its_own_workloads_only() {
    let c = Cluster::start();
    let vision = c.submit(VISION_LONG, "run-1");
    let nlp = c.submit(NLP_BROKEN, "run-2");
    let admin = c.login(&Role::Admin);
    c.until("both workloads to be planned", || {
        let list: WorkloadList = c
            .ask(
                &admin,
                &contract::workloads_subject(None),
                &WorkloadsQuery::default(),
            )
            .ok()?;
        (list.workloads.len() == 2).then_some(())
    });
    let team = c.login(&Role::Team("vision".into()));

    // Its own subject: its own workloads.
    let own: WorkloadList = c
        .ask(
            &team,
            &contract::workloads_subject(Some("vision")),
            &WorkloadsQuery::default(),
        )
        .unwrap();
    assert_eq!(ids(&own), [&vision]);
    let shown: WorkloadDetail = c
        .ask(
            &team,
            &contract::workload_subject(Some("vision")),
            &WorkloadQuery { id: vision.clone() },
        )
        .unwrap();
    assert_eq!(shown.workload.team, "vision");

    // Another team's workload is unknown to it, as if it did not exist.
    let other: Result<WorkloadDetail, _> = c.ask(
        &team,
        &contract::workload_subject(Some("vision")),
        &WorkloadQuery { id: nlp.clone() },
    );
    assert_eq!(other.unwrap_err().0, contract::NOT_FOUND);
    let other: Result<WorkloadList, _> = c.ask(
        &team,
        &contract::workloads_subject(Some("vision")),
        &WorkloadsQuery {
            team: Some("nlp".into()),
            ..WorkloadsQuery::default()
        },
    );
    assert_eq!(other.unwrap_err().0, contract::BAD_REQUEST);

    // The server lets it ask neither about another team nor about every team.
    for subject in [
        contract::workloads_subject(Some("nlp")),
        contract::workloads_subject(None),
        contract::workload_subject(Some("nlp")),
        contract::workload_subject(None),
    ] {
        let asked: Result<serde_json::Value, _> =
            c.ask(&team, &subject, &WorkloadsQuery::default());
        assert_eq!(asked.unwrap_err().0, 0, "{subject} was answered");
    }
}

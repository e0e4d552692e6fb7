//! What the planner's integration tests share: one 4-GPU node in a pool, with the allocator and
//! the planner running against a real nats-server, and submissions made as `allot submit`
//! makes them.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use async_nats::jetstream;

use allot_bus::users::Role;
use allot_bus::{Publisher, catalog, ensure_streams};
use allot_events::NodeEvent;
use allot_events::workload::Workload;
use allot_testkit::node;

/// The pool every test plans into.
pub const POOL: &str = "default";

/// The services of a pool and a client to drive them.
pub struct Stack {
    pub rt: tokio::runtime::Runtime,
    pub js: jetstream::Context,
    pub publisher: Publisher,
    /// The planner's database (read by the tests that look inside it).
    #[allow(dead_code)]
    pub db: PathBuf,
    _data: tempfile::TempDir,
}

impl Stack {
    /// Creates the streams, registers node `n1` (4 GPUs), and starts the allocator (fifo) and
    /// the planner, each connecting to `login(its role)` (the test's own client logs in as
    /// `admin`). The planner checks capacity once the fleet has been quiet for `settle`.
    pub fn start(login: impl Fn(&Role) -> String, settle: Duration) -> Stack {
        let data = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let admin = login(&Role::Admin);
        let (js, publisher) = rt.block_on(async {
            let client =
                allot_bus::connect::with_url_credentials(async_nats::ConnectOptions::new(), &admin)
                    .connect(allot_bus::server_list(&admin))
                    .await
                    .unwrap();
            let js = jetstream::new(client.clone());
            ensure_streams(&js, &catalog(1)).await.unwrap();
            let publisher = Publisher::new(client, "/test");
            let n1 = node("n1").gpus(4).pool(POOL).registered();
            publisher.publish(NodeEvent::Registered(n1)).await.unwrap();
            (js, publisher)
        });
        let allocator = allot_allocator::Config {
            policy: "fifo".into(),
            instance: "a".into(),
            lease_ttl: Duration::from_secs(2),
            pass_interval: Duration::from_millis(200),
            ..allot_allocator::Config::new(login(&Role::Allocator), POOL)
        };
        rt.spawn(async move {
            allot_allocator::run(allocator, std::future::pending())
                .await
                .unwrap();
        });
        let planner = allot_planner::Config {
            capacity_settle: settle,
            ..allot_planner::Config::new(login(&Role::Planner), data.path())
        };
        let db = planner.db_path();
        rt.spawn(async move {
            allot_planner::run(planner, std::future::pending())
                .await
                .unwrap();
        });
        Stack {
            rt,
            js,
            publisher,
            db,
            _data: data,
        }
    }

    /// Submits `workload` as `allot submit` would, from CI run `run` if any; returns its id.
    pub fn submit(&self, workload: Workload, run: Option<&str>) -> String {
        let key = allot_workload::submit::idempotency_key(&workload, run);
        let submission = allot_workload::submit::submission(
            workload,
            key,
            run.map(str::to_owned),
            "ci@test".into(),
            "/test",
            chrono::Utc::now(),
        );
        self.rt.block_on(async {
            self.publisher
                .publish_envelope(&submission.envelope)
                .await
                .unwrap()
        });
        submission.workload_id
    }
}

/// Polls `check` until it gives something, for up to 30 s.
pub fn until<T>(mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(t) = check() {
            return Some(t);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

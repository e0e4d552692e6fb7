//! Two gateways over the same streams at once, one of them SIGKILLed again and again while the
//! cluster works and restarted each time, and once SIGSTOPped past its ack wait: both end
//! with the same read models and the same
//! change log (every workload, task, attempt, decision and change exactly once), as a gateway
//! that was never interrupted has them.

use std::path::Path;
use std::time::Duration;

use crate::cluster::Cluster;
use crate::support::{free_port, wait_for, warnings_in};

/// Three 1-GPU steps in a chain, a minute each (0.1 s at the cluster's speed-up).
fn pipeline(i: usize) -> String {
    let team = ["vision", "nlp"][i % 2];
    format!(
        r#"
apiVersion: allot/v1
kind: Workload
metadata: {{name: chain-{i}, team: {team}}}
spec:
  tasks:
    - {{name: prep, resources: {{gpus: 1}}, command: [prep], durationEstimate: 1m}}
    - {{name: train, resources: {{gpus: 2}}, command: [train], after: [prep], durationEstimate: 2m}}
    - {{name: eval, resources: {{gpus: 1}}, command: [eval], after: [train], durationEstimate: 1m}}
"#
    )
}

/// What a user can see of a gateway's read models: every workload, task, attempt and decision,
/// and how many changes of each kind its event stream carries (the cluster's own — node
/// readings — change all the time and are left out).
fn dump(db: &Path) -> Option<String> {
    let conn = allot_store::rusqlite::Connection::open_with_flags(
        db,
        allot_store::rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .ok()?;
    let mut out = String::new();
    for sql in [
        "SELECT id || ' ' || state FROM workloads ORDER BY id",
        "SELECT workload || '/' || name || ' ' || state || ' ' || attempt FROM tasks \
         ORDER BY workload, name",
        "SELECT 'attempts ' || COUNT(*) FROM attempts",
        "SELECT 'decisions ' || COUNT(*) FROM decisions",
        "SELECT kind || ' ' || COUNT(*) FROM changes WHERE kind IN \
         ('workload', 'task', 'decision', 'abort_requested', 'abort_answered') \
         GROUP BY kind ORDER BY kind",
    ] {
        let mut stmt = conn.prepare(sql).ok()?;
        let rows = stmt
            .query_map([], |r| r.get::<_, String>(0))
            .ok()?
            .collect::<Result<Vec<_>, _>>()
            .ok()?;
        for r in rows {
            out.push_str(&r);
            out.push('\n');
        }
    }
    Some(out)
}

/// Runs gateway `name`; its consumers wait 1 s for an acknowledgement before redelivering, so
/// a pause of a few seconds outlasts it.
fn gateway(cluster: &mut Cluster, name: &str) {
    let data = cluster.path(name);
    let listen = format!("127.0.0.1:{}", free_port());
    cluster.spawn(
        name,
        &[
            "gateway",
            "--data-dir",
            data.to_str().unwrap(),
            "--consumer-prefix",
            name,
            "--listen",
            &listen,
            "--ack-wait",
            "1s",
        ],
    );
}

#[test]
fn a_gateway_killed_again_and_again_and_paused_beside_another_ends_with_the_same_read_models() {
    let mut cluster = Cluster::start_simulated(&[("n1", 4), ("n2", 4)], 600);
    gateway(&mut cluster, "steady");
    gateway(&mut cluster, "crashy");
    let steady_db = cluster.path("steady/gateway.db");
    let crashy_db = cluster.path("crashy/gateway.db");

    const WORKLOADS: usize = 12;
    let mut ids = Vec::new();
    for i in 0..WORKLOADS {
        ids.push(cluster.submit(&format!("chain-{i}"), &pipeline(i)));
        // Once, the second gateway is paused past its ack wait while the cluster works: what
        // it had pulled is redelivered, and it must still apply each event once.
        if i == 4 {
            cluster.signal("crashy", "STOP");
            std::thread::sleep(Duration::from_secs(3));
            cluster.signal("crashy", "CONT");
        }
        // Every third submission, the second gateway dies without a goodbye and comes back.
        if i % 3 == 2 {
            std::thread::sleep(Duration::from_millis(150 * (i as u64 % 4 + 1)));
            cluster.kill("crashy");
            gateway(&mut cluster, "crashy");
        }
    }

    // Both catch up with a cluster that has finished everything, and agree row for row.
    let settled = wait_for(Duration::from_secs(120), || {
        let steady = dump(&steady_db)?;
        let done = ids
            .iter()
            .all(|id| steady.contains(&format!("{id} succeeded")));
        let crashy = dump(&crashy_db)?;
        (done && steady == crashy).then_some(steady)
    });
    let Some(settled) = settled else {
        let steady = dump(&steady_db).unwrap_or_default();
        let crashy = dump(&crashy_db).unwrap_or_default();
        // What tells why comes last, where a report cut in the middle still shows it.
        let unfinished: Vec<&String> = ids
            .iter()
            .filter(|id| !steady.contains(&format!("{id} succeeded")))
            .collect();
        let only = |a: &str, b: &str| -> Vec<String> {
            let b: std::collections::BTreeSet<&str> = b.lines().collect();
            a.lines()
                .filter(|l| !b.contains(l))
                .map(str::to_owned)
                .collect()
        };
        panic!(
            "the gateways never agreed on a finished cluster:\nsteady:\n{steady}\ncrashy:\n\
             {crashy}\n{}\n{}\nnot succeeded as the steady gateway shows \
             them: {unfinished:?}\nonly the steady gateway shows: {:?}\nonly the crashy \
             gateway shows: {:?}",
            cluster.logs(),
            warnings_in(cluster.dir.path(), 10),
            only(&steady, &crashy),
            only(&crashy, &steady),
        )
    };
    // Exactly once: three tasks per workload, one attempt each, and one change per transition.
    assert_eq!(
        settled
            .lines()
            .filter(|l| l.ends_with(" succeeded 1"))
            .count(),
        3 * WORKLOADS,
        "{settled}"
    );
    assert!(
        settled.contains(&format!("attempts {}\n", 3 * WORKLOADS)),
        "{settled}"
    );
}

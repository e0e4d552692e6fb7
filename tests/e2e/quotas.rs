//! Team quotas from the teams file hold in the live allocator.

use std::collections::BTreeSet;

use allot_events::workload::WorkloadOutcome;
use allot_sched::Decision;

use crate::cluster::Cluster;

/// Team nlp may use 2 GPUs and borrow none; vision owns the rest of the pool.
const TEAMS: &str = "teams:
  - name: nlp
    quota: {gpus: 2, borrowingLimit: 0}
  - name: vision
    quota: {gpus: 14}
";

/// Three 2-GPU tasks of team nlp, each 2 min of task time (1 s at the speed-up used here).
const THREE_PAIRS: &str = "apiVersion: allot/v1
kind: Workload
metadata: {name: pairs, team: nlp}
spec:
  tasks:
    - {name: a, resources: {gpus: 2}, durationEstimate: 2m, command: [\"true\"]}
    - {name: b, resources: {gpus: 2}, durationEstimate: 2m, command: [\"true\"]}
    - {name: c, resources: {gpus: 2}, durationEstimate: 2m, command: [\"true\"]}
";

#[test]
fn a_team_never_holds_more_than_its_quota_although_gpus_are_free() {
    let mut cluster = Cluster::start_simulated(&[("n1", 8), ("n2", 8)], 120);
    let teams = cluster.path("teams.yaml");
    std::fs::write(&teams, TEAMS).unwrap();
    // The allocator started without quotas: replace it by one that reads the teams file.
    cluster.kill("allocator-a1");
    cluster.allocator_with("q1", &["--teams", teams.to_str().unwrap()]);

    let workload = cluster.submit("pairs", THREE_PAIRS);
    let finished = cluster.finished(&workload);
    assert_eq!(finished.outcome, WorkloadOutcome::Succeeded, "{finished:?}");

    // Walk the journal: at no moment did nlp hold two leases (4 GPUs) at once, and the
    // waiting tasks were told why.
    let mut held = BTreeSet::new();
    let mut most = 0;
    let mut waited_for_quota = false;
    for applied in cluster.journal() {
        for d in &applied.entry.decisions {
            match d {
                Decision::Granted { task, .. } => {
                    held.insert(*task);
                }
                Decision::Released { task, .. } | Decision::Preempted { task, .. } => {
                    held.remove(task);
                }
                Decision::Waiting { reason, .. } => {
                    waited_for_quota |= format!("{reason:?}").contains("Quota");
                }
                _ => {}
            }
            most = most.max(held.len());
        }
    }
    assert_eq!(
        most, 1,
        "nlp held {most} 2-GPU leases at once on a 16-GPU pool"
    );
    assert!(
        waited_for_quota,
        "the waiting tasks were told it was the quota"
    );
}

use allot_bus::Delivery;
use allot_events::node::{HeartbeatSent, NodeRegistered};
use allot_events::telemetry::GpusSampled;
use allot_events::{AnyEvent, Envelope};
use allot_store::rusqlite::Connection;
use allot_testkit::node;

use super::*;

fn db() -> Connection {
    allot_store::open_in_memory(MIGRATIONS).unwrap()
}

fn delivery(seq: u64, event: impl Into<AnyEvent>) -> Delivery {
    Delivery::first(
        seq,
        Envelope::new("/test", event),
        "2026-11-22T10:00:00Z".parse().unwrap(),
    )
}

fn registered(name: &str, gpus: u32) -> NodeRegistered {
    node(name).gpus(gpus).registered()
}

fn sampled(name: &str, gpus: u32, util: u8) -> GpusSampled {
    node(name).gpus(gpus).sampled(util)
}

fn apply_each(conn: &Connection, events: &[Delivery]) {
    for d in events {
        apply(conn, d).unwrap();
    }
}

#[test]
fn registration_and_telemetry_give_the_same_state_in_either_order() {
    let reg = delivery(1, registered("node-1", 2));
    let hb = delivery(
        2,
        HeartbeatSent {
            node: "node-1".into(),
            seq: 1,
            uptime_s: 5,
        },
    );
    let tel = delivery(3, sampled("node-1", 2, 40));

    let a = db();
    apply_each(&a, &[reg.clone(), hb.clone(), tel.clone()]);
    let b = db();
    apply_each(&b, &[tel, hb, reg]);
    assert_eq!(dump(&a).unwrap(), dump(&b).unwrap());
    let status = crate::query::status(&a, chrono::Utc::now()).unwrap();
    assert_eq!(status.nodes.len(), 1);
    assert_eq!(status.gpu_count(), 2);
    assert_eq!(status.nodes[0].gpus[0].utilization_pct, Some(40));
    assert_eq!(status.nodes[0].gpus[0].model.as_deref(), Some("H100"));
}

#[test]
fn a_gpu_that_reports_from_another_node_or_index_moves_there() {
    let conn = db();
    let first = sampled("node-1", 2, 40);
    let uuid = first.samples[1].uuid.clone();
    apply_each(&conn, &[delivery(1, first)]);
    let mut moved = sampled("node-2", 1, 60);
    moved.samples[0].uuid.clone_from(&uuid);
    moved.samples[0].index = 3;
    apply_each(&conn, &[delivery(2, moved)]);
    let (node, idx, util, samples): (String, u32, u8, i64) = conn
        .query_row(
            "SELECT node, idx, utilization_pct, samples FROM gpus WHERE uuid = ?1",
            [&uuid],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .unwrap();
    assert_eq!((node.as_str(), idx, util, samples), ("node-2", 3, 60, 2));
}

#[test]
fn a_re_registration_forgets_gpus_the_node_no_longer_has() {
    let conn = db();
    apply_each(
        &conn,
        &[
            delivery(1, registered("node-1", 4)),
            delivery(2, registered("node-1", 2)),
        ],
    );
    let status = crate::query::status(&conn, chrono::Utc::now()).unwrap();
    assert_eq!(status.gpu_count(), 2);
}

#[test]
fn uncorrected_ecc_in_a_sample_makes_the_gpu_unhealthy_with_a_reason() {
    let conn = db();
    let mut bad = sampled("node-1", 2, 10);
    bad.samples[1].ecc_uncorrected = Some(3);
    apply_each(
        &conn,
        &[delivery(1, registered("node-1", 2)), delivery(2, bad)],
    );
    let status = crate::query::status(&conn, chrono::Utc::now()).unwrap();
    let gpus = &status.nodes[0].gpus;
    assert_eq!(gpus[0].health, "healthy");
    assert_eq!(gpus[1].health, "unhealthy");
    assert_eq!(gpus[1].health_reason, "3 uncorrected ECC errors");
}

#[test]
fn a_node_name_that_would_break_subjects_is_rejected() {
    let conn = db();
    let err = apply(
        &conn,
        &delivery(
            1,
            HeartbeatSent {
                node: "a.b".into(),
                seq: 1,
                uptime_s: 1,
            },
        ),
    )
    .unwrap_err();
    assert!(
        matches!(err, ApplyError::Rejected(ref m) if m.contains("\"a.b\"")),
        "{err}"
    );
}

mod coalescing {
    use proptest::prelude::*;

    use super::*;

    /// One event of a small fleet: 0 = registration, 1 = heartbeat, 2.. = telemetry.
    fn event(kind: u8, node: u8, value: u8) -> AnyEvent {
        let node = format!("node-{node}");
        match kind {
            0 => registered(&node, 1 + u32::from(value % 3)).into(),
            1 => HeartbeatSent {
                node,
                seq: u64::from(value),
                uptime_s: 1,
            }
            .into(),
            _ => {
                let mut s = sampled(&node, 2, value % 101);
                s.samples[0].power_limit_mw =
                    value.is_multiple_of(2).then_some(u64::from(value) * 1000);
                s.samples[1].ecc_uncorrected = Some(u64::from(value.is_multiple_of(7)));
                s.samples[1].temperature_c = Some(50 + u32::from(value % 50));
                s.into()
            }
        }
    }

    proptest! {
        #[test]
        fn coalesced_batches_leave_the_same_state_as_one_event_at_a_time(
            events in proptest::collection::vec((0u8..5, 0u8..3, any::<u8>()), 1..60),
            cuts in proptest::collection::vec(1usize..8, 1..20),
        ) {
            let deliveries: Vec<Delivery> = events
                .iter()
                .enumerate()
                .map(|(i, (k, n, v))| delivery(i as u64 + 1, event(*k, *n, *v)))
                .collect();
            let one_by_one = db();
            for d in &deliveries {
                apply(&one_by_one, d).unwrap();
            }
            let batched = db();
            let mut rest: &[Delivery] = &deliveries;
            for cut in cuts.iter().cycle() {
                if rest.is_empty() {
                    break;
                }
                let (batch, tail) = rest.split_at((*cut).min(rest.len()));
                let refs: Vec<&Delivery> = batch.iter().collect();
                apply_all(&batched, &refs).unwrap();
                rest = tail;
            }
            prop_assert_eq!(dump(&one_by_one).unwrap(), dump(&batched).unwrap());
        }
    }
}

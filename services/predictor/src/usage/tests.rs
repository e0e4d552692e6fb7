use allot_bus::consumer::{Delivery, Handler, Outcome};
use allot_events::telemetry::{GpuHeld, GpuSample, GpusSampled};
use allot_events::{Envelope, TelemetryEvent};
use allot_sched::LeaseId;
use allot_store::rusqlite::Connection;

use super::apply_sample;

fn sample(index: u32, used_mib: u64, util: Option<u8>) -> GpuSample {
    GpuSample {
        index,
        uuid: format!("GPU-{index}"),
        utilization_pct: util,
        memory_used_mib: used_mib,
        memory_total_mib: 81_920,
        temperature_c: None,
        power_mw: None,
        power_limit_mw: None,
        ecc_corrected: None,
        ecc_uncorrected: None,
        xid_errors: None,
        last_xid: None,
        xids: Vec::new(),
        slowdown_temperature_c: None,
        throttle_reasons: Vec::new(),
        rows_remapped_uncorrectable: None,
        row_remap_failed: None,
        nvlink_errors: None,
    }
}

fn held(index: u32, lease: u64, task: &str, milli: u32) -> GpuHeld {
    GpuHeld {
        index,
        lease: LeaseId(lease),
        workload: "train-0123456789".into(),
        task: task.into(),
        team: "vision".into(),
        milli,
        no_idle_reclaim: false,
    }
}

fn delivery(seq: u64, samples: Vec<GpuSample>, held: Vec<GpuHeld>) -> Delivery {
    let event = TelemetryEvent::GpusSampled(GpusSampled {
        node: "node-1".into(),
        samples,
        held,
    });
    Delivery {
        stream_sequence: seq,
        subject: "allot.telemetry.node-1".into(),
        published: chrono::Utc::now(),
        deliveries: 1,
        event: Envelope::new("/allot/collector/node-1", event),
    }
}

/// (task, samples, peak MiB, util samples, util sum) per usage row, by task name and GPU.
fn rows(conn: &Connection) -> Vec<(String, u32, i64, i64, i64, f64)> {
    conn.prepare(
        "SELECT name, gpu, samples, peak_memory_mib, util_samples, util_sum FROM usage
         ORDER BY name, gpu",
    )
    .unwrap()
    .query_map([], |r| {
        Ok((
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
        ))
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

#[tokio::test]
async fn a_shared_gpu_is_charged_by_share_and_a_redelivered_sample_counts_once() {
    let mut t = allot_store::Projection::new(
        allot_store::open_in_memory(crate::MIGRATIONS).unwrap(),
        "predictor-telemetry",
        "predictor",
        apply_sample,
    );
    // GPU 0: `train` alone (a whole GPU). GPU 1: `a` holds 250 and `b` 750 milli of it.
    let first = vec![
        delivery(
            1,
            vec![sample(0, 20_000, Some(50)), sample(1, 8_000, Some(40))],
            vec![
                held(0, 1, "train", 1000),
                held(1, 2, "a", 250),
                held(1, 3, "b", 750),
            ],
        ),
        delivery(
            2,
            vec![sample(0, 30_000, Some(70)), sample(1, 4_000, None)],
            vec![
                held(0, 1, "train", 1000),
                held(1, 2, "a", 250),
                held(1, 3, "b", 750),
            ],
        ),
    ];
    let outcomes = t.handle(&first).await.unwrap();
    assert_eq!(outcomes, vec![Outcome::Handled; 2]);
    let want = vec![
        // a: a quarter of 8,000 and 4,000 MiB; a quarter of 40% (the second had no reading).
        ("a".to_owned(), 1, 2, 2_000, 1, 10.0),
        ("b".to_owned(), 1, 2, 6_000, 1, 30.0),
        ("train".to_owned(), 0, 2, 30_000, 2, 120.0),
    ];
    assert_eq!(rows(t.conn()), want);

    // The same batch again (redelivered after a crash before the acknowledgement), and a batch
    // that overlaps it: only the new sample counts.
    t.handle(&first).await.unwrap();
    assert_eq!(rows(t.conn()), want, "a redelivered sample counted twice");
    t.handle(&[
        first[1].clone(),
        delivery(
            3,
            vec![sample(0, 10_000, Some(30))],
            vec![held(0, 1, "train", 1000)],
        ),
    ])
    .await
    .unwrap();
    let train = rows(t.conn()).pop().unwrap();
    assert_eq!(train, ("train".to_owned(), 0, 3, 30_000, 3, 150.0));
}

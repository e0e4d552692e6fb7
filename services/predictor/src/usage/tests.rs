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
    assert_eq!(rows(&t.conn()), want);

    // The same batch again (redelivered after a crash before the acknowledgement), and a batch
    // that overlaps it: only the new sample counts.
    t.handle(&first).await.unwrap();
    assert_eq!(rows(&t.conn()), want, "a redelivered sample counted twice");
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
    let train = rows(&t.conn()).pop().unwrap();
    assert_eq!(train, ("train".to_owned(), 0, 3, 30_000, 3, 150.0));
}

/// A task key's history of `runs` finished attempts (every third unmeasured), another key's
/// beside it, and a fleet of two pools with three models.
fn history(runs: i64) -> Connection {
    let conn = allot_store::open_in_memory(crate::MIGRATIONS).unwrap();
    for task in 1..=runs * 2 {
        let (identity, workload) = if task % 2 == 0 {
            ("vision/train/step", "train")
        } else {
            ("nlp/tune/step", "tune")
        };
        // Finish times out of submission order, some equal.
        let finished = 1_000 + (task * 7919) % 97 * 10;
        conn.execute(
            "INSERT INTO tasks (task, pool, workload, name, team, identity, gpus, gpu_milli,
                                submit_ms, prediction, outcome, finished_ms)
             VALUES (?1, 'default', ?2, 'step', 'vision', ?3, 1, 1000, 0, '{}',
                     CASE WHEN ?1 % 5 = 0 THEN 'failed' ELSE 'completed' END, ?4)",
            allot_store::rusqlite::params![task, workload, identity, finished],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO runs (task, lease, node) VALUES (?1, ?1, 'node-1')",
            [task],
        )
        .unwrap();
        if task % 3 != 0 {
            conn.execute(
                "INSERT INTO usage VALUES (?1, 'step', ?2, 'node-1', 0, ?3, ?4, 1, 50.0, 81920)",
                allot_store::rusqlite::params![workload, task, task % 4, 1_000 + task],
            )
            .unwrap();
        }
    }
    for (node, pool, model, memory) in [
        ("a", "default", "H100", 81_920),
        ("b", "default", "H100", 95_830),
        ("c", "default", "L4", 23_034),
        ("d", "default", "A100", 40_960),
        ("e", "default", "A100", 81_920),
        ("f", "other", "H200", 143_771),
    ] {
        for gpu in 0..4 {
            conn.execute(
                "INSERT INTO gpus VALUES (?1, ?2, ?3, ?4, ?5)",
                allot_store::rusqlite::params![node, gpu, pool, model, memory],
            )
            .unwrap();
        }
    }
    conn
}

/// Right-sizing reads only a key's newest measured runs; they must be exactly the ones the
/// whole history ends with.
#[test]
fn the_newest_measured_runs_are_the_tail_of_the_whole_history() {
    let conn = history(60);
    let all: Vec<u64> = super::finished_usage(&conn, "vision/train/step")
        .unwrap()
        .into_iter()
        .filter(|u| u.samples > 0)
        .map(|u| u.task)
        .collect();
    assert!(all.len() > 12, "{}", all.len());
    for wanted in [0, 1, 10, all.len(), all.len() + 5] {
        let recent: Vec<u64> = super::recent_usage(&conn, "vision/train/step", wanted)
            .unwrap()
            .into_iter()
            .map(|u| u.task)
            .collect();
        assert_eq!(recent, all[all.len().saturating_sub(wanted)..], "{wanted}");
    }
}

/// The pool's models, each with its largest memory, as grouping every GPU gives them.
#[test]
fn offers_name_each_model_of_the_pool_once_with_its_largest_memory() {
    let conn = history(1);
    let prices =
        allot_prices::PriceTable::parse(include_str!("../../../../examples/prices.yaml")).unwrap();
    let offers: Vec<(String, u64)> = super::offers(&conn, "default", &prices, 0)
        .unwrap()
        .into_iter()
        .map(|o| (o.model, o.memory_mib))
        .collect();
    assert_eq!(
        offers,
        [
            ("A100".to_owned(), 81_920),
            ("H100".to_owned(), 95_830),
            ("L4".to_owned(), 23_034)
        ]
    );
    assert!(super::offers(&conn, "none", &prices, 0).unwrap().is_empty());
}

//! The GPU packing experiment (`openb-packing`): on a small openb-format trace written for the
//! test, and on the real openb trace in `../shared/traces` (skipped with a message when the
//! folder is absent), where best fit must land near the FGD paper's BestFit and FGD above it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use allot_sim::TraceJob;
use allot_sim::load::openb;
use allot_sim::packing::{self, Order, PackingError};
use tempfile::TempDir;

// ---------------------------------------------------------------------------------------------
// Helpers

const POD_HEADER: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,\
                          creation_time,deletion_time,scheduled_time";

/// A small cluster: a CPU-only node and three GPU nodes of different models, 14 GPUs in all.
const NODES: &str = "sn,cpu_milli,memory_mib,gpu,model
cpu-0,32000,131072,0,
t4-0,32000,131072,2,T4
g2-0,96000,393216,8,G2
v100-0,64000,262144,4,V100M16
";

/// 12 pods: fractions, whole GPUs, a CPU-only pod, a model constraint and a model the cluster
/// does not have; 10,860 milli-GPU in all, below the 130% target of 18,200.
fn pods_csv() -> String {
    let shapes: [(u64, u64, u32, u32, &str); 10] = [
        (4_000, 16_384, 1, 500, ""),
        (8_000, 32_768, 1, 1000, ""),
        (2_000, 8_192, 1, 250, ""),
        (6_000, 24_576, 0, 0, ""),
        (12_000, 65_536, 2, 1000, ""),
        (4_000, 16_384, 1, 460, "V100M16"),
        (3_000, 12_288, 1, 700, ""),
        (16_000, 98_304, 4, 1000, ""),
        (2_000, 8_192, 1, 300, "A100"),
        (1_000, 4_096, 1, 150, ""),
    ];
    let mut out = format!("{POD_HEADER}\n");
    for i in 0..12 {
        let (cpu, memory, gpus, milli, spec) = shapes[i % shapes.len()];
        out.push_str(&format!(
            "pod-{i:03},{cpu},{memory},{gpus},{milli},{spec},LS,Running,{},,\n",
            i * 10
        ));
    }
    out
}

/// A folder with the small trace: `pods.csv` and `nodes.csv`.
fn small_trace() -> TempDir {
    let dir = TempDir::new().expect("a temporary folder");
    std::fs::write(dir.path().join("pods.csv"), pods_csv()).expect("pods written");
    std::fs::write(dir.path().join("nodes.csv"), NODES).expect("nodes written");
    dir
}

fn run(dir: &Path, policy: &str, seeds: u32) -> packing::PackingResult {
    packing::run(
        &dir.join("pods.csv"),
        &dir.join("nodes.csv"),
        policy,
        seeds,
        packing::DEFAULT_ARRIVAL,
    )
    .unwrap_or_else(|err| panic!("{policy}: {err}"))
}

fn demand(jobs: &[&TraceJob]) -> u64 {
    jobs.iter()
        .map(|j| u64::from(j.gpus) * u64::from(j.gpu_milli))
        .sum()
}

/// The real openb trace, or `None` (after saying so) when this checkout does not have it.
fn real_openb(test: &str) -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces/openb");
    if dir.join("pods.csv").is_file() && dir.join("nodes_all.csv").is_file() {
        Some(dir)
    } else {
        eprintln!(
            "skipping {test}: the openb trace is not at {} (see shared/traces/README.md)",
            dir.display()
        );
        None
    }
}

// ---------------------------------------------------------------------------------------------
// The small trace

#[test]
fn each_seed_gives_the_same_allocation_every_time_and_a_share_of_capacity() {
    let dir = small_trace();
    for policy in ["bestfit", "fgd"] {
        let first = run(dir.path(), policy, 4);
        let again = run(dir.path(), policy, 4);
        assert_eq!(first.runs, again.runs, "{policy}: same seeds, same runs");
        assert_eq!(
            first.runs.iter().map(|r| r.seed).collect::<Vec<_>>(),
            [0, 1, 2, 3],
            "{policy}"
        );
        for r in &first.runs {
            assert_eq!(r.capacity_milli, 14_000, "{policy}");
            assert!(
                r.gpu_allocation_ratio > 0.0 && r.gpu_allocation_ratio <= 1.0,
                "{policy} seed {}: ratio {}",
                r.seed,
                r.gpu_allocation_ratio
            );
            assert!(
                r.placed < r.pods,
                "{policy}: 130% of capacity cannot all fit"
            );
            let unallocated = (r.capacity_milli - r.allocated_milli) as f64 / 1000.0;
            assert_eq!(r.unallocated_gpus(), unallocated);
        }
        assert!(first.mean > 0.0 && first.mean <= 1.0, "{policy}");
        assert!(first.stddev >= 0.0, "{policy}");
        assert_eq!((first.trace_pods, first.nodes), (12, 4), "{policy}");
    }
}

#[test]
fn arrivals_are_the_trace_in_order_then_resampled_pods_up_to_the_target() {
    let dir = small_trace();
    let trace = openb::load(&dir.path().join("pods.csv"), &dir.path().join("nodes.csv")).unwrap();
    let jobs = &trace.jobs;
    let target = 18_200;
    let arrivals = packing::arrivals(jobs, 14_000, 1.3, 7, Order::Trace);

    let in_trace_order: Vec<u32> = arrivals[..jobs.len()].iter().map(|j| j.id).collect();
    assert_eq!(
        in_trace_order,
        jobs.iter().map(|j| j.id).collect::<Vec<_>>()
    );
    assert!(arrivals.len() > jobs.len(), "topped up");
    let total = demand(&arrivals);
    assert!(total <= target, "{total} > {target}");
    let largest = demand(
        &jobs
            .iter()
            .map(|j| vec![j])
            .max_by_key(|j| demand(j))
            .unwrap(),
    );
    assert!(
        total + largest > target,
        "topping up stops only when the next pod drawn does not fit ({total})"
    );
    assert!(arrivals[jobs.len()..].iter().all(|j| jobs.contains(*j)));

    let other_seed = packing::arrivals(jobs, 14_000, 1.3, 8, Order::Trace);
    assert_ne!(
        arrivals[jobs.len()..]
            .iter()
            .map(|j| j.id)
            .collect::<Vec<_>>(),
        other_seed[jobs.len()..]
            .iter()
            .map(|j| j.id)
            .collect::<Vec<_>>(),
        "each seed draws its own top-up"
    );
}

#[test]
fn a_shuffled_order_permutes_the_trace_before_topping_up() {
    let dir = small_trace();
    let trace = openb::load(&dir.path().join("pods.csv"), &dir.path().join("nodes.csv")).unwrap();
    let jobs = &trace.jobs;
    let arrivals = packing::arrivals(jobs, 14_000, 1.3, 7, Order::Shuffled);
    let head: Vec<u32> = arrivals[..jobs.len()].iter().map(|j| j.id).collect();
    let ids: HashSet<u32> = head.iter().copied().collect();
    assert_eq!(ids.len(), jobs.len(), "every trace pod exactly once");
    assert_ne!(head, jobs.iter().map(|j| j.id).collect::<Vec<_>>());
    assert!(demand(&arrivals) <= 18_200);
}

#[test]
fn below_the_trace_demand_randomly_drawn_pods_are_dropped() {
    let dir = small_trace();
    let trace = openb::load(&dir.path().join("pods.csv"), &dir.path().join("nodes.csv")).unwrap();
    let arrivals = packing::arrivals(&trace.jobs, 14_000, 0.3, 1, Order::Trace);
    assert!(demand(&arrivals) <= 4_200);
    assert!(arrivals.len() < trace.jobs.len());
    assert!(
        arrivals.windows(2).all(|w| w[0].id < w[1].id),
        "what remains keeps trace order"
    );
}

#[test]
fn settings_that_cannot_run_are_refused() {
    let dir = small_trace();
    let (pods, nodes) = (dir.path().join("pods.csv"), dir.path().join("nodes.csv"));
    let refused = |policy: &str, seeds: u32, arrival: f64| {
        packing::run(&pods, &nodes, policy, seeds, arrival).expect_err("refused")
    };
    assert!(matches!(
        refused("worst-fit", 1, 1.3),
        PackingError::UnknownPolicy(_)
    ));
    assert!(matches!(
        refused("bestfit", 1, 0.0),
        PackingError::BadArrival(_)
    ));
    assert!(matches!(
        refused("bestfit", 1, f64::NAN),
        PackingError::BadArrival(_)
    ));
    assert!(matches!(refused("bestfit", 0, 1.3), PackingError::NoSeeds));
    let missing = packing::run(&dir.path().join("absent.csv"), &nodes, "bestfit", 1, 1.3);
    assert!(matches!(missing, Err(PackingError::Load(_))));
}

// ---------------------------------------------------------------------------------------------
// The real trace

#[test]
fn on_openb_bestfit_lands_near_the_published_bestfit_and_fgd_allocates_more() {
    let test = "on_openb_bestfit_lands_near_the_published_bestfit_and_fgd_allocates_more";
    let Some(dir) = real_openb(test) else { return };
    let run = |policy: &str| {
        packing::run(
            &dir.join("pods.csv"),
            &dir.join("nodes_all.csv"),
            policy,
            1,
            packing::DEFAULT_ARRIVAL,
        )
        .unwrap()
    };
    let bestfit = run("bestfit");
    let fgd = run("fgd");
    let published = packing::published("bestfit").unwrap();
    assert_eq!(bestfit.runs[0].capacity_milli, 6_212_000, "6,212 GPUs");
    assert_eq!(bestfit.nodes, 1_523);
    assert!(
        (bestfit.mean - published).abs() <= 0.03,
        "bestfit {:.2}% vs published {:.2}%",
        bestfit.mean * 100.0,
        published * 100.0
    );
    assert!(
        fgd.mean >= bestfit.mean,
        "fgd {:.2}% < bestfit {:.2}%",
        fgd.mean * 100.0,
        bestfit.mean * 100.0
    );
}

use super::*;
use crate::model::NodeSpec;
use crate::scheduler::{Input, Scheduler};
use crate::{Decision, TaskId};

// ---------------------------------------------------------------------------------------------
// Builders

fn node(name: &str) -> NodeBuilder {
    NodeBuilder {
        spec: NodeSpec {
            name: name.into(),
            gpus: 2,
            gpu_model: "G2".into(),
            cpu_milli: 64_000,
            memory_mib: 262_144,
            ..NodeSpec::default()
        },
        free: None,
        cpu_used: 0,
        memory_used: 0,
    }
}

#[derive(Clone)]
struct NodeBuilder {
    spec: NodeSpec,
    /// Free milli-GPU of each GPU (all free when `None`).
    free: Option<Vec<u32>>,
    cpu_used: u64,
    memory_used: u64,
}

impl NodeBuilder {
    /// GPUs with these free shares (the node gets as many GPUs).
    fn free(mut self, free: &[u32]) -> Self {
        self.spec.gpus = free.len() as u32;
        self.free = Some(free.to_vec());
        self
    }
    fn model(mut self, model: &str) -> Self {
        self.spec.gpu_model = model.into();
        self
    }
    /// A node without GPUs.
    fn cpu_only(mut self) -> Self {
        self.spec.gpus = 0;
        self.spec.gpu_model = String::new();
        self.free = Some(Vec::new());
        self
    }
    fn cpu_free(mut self, cpu: u64) -> Self {
        self.cpu_used = self.spec.cpu_milli - cpu;
        self
    }
    fn memory_free(mut self, memory: u64) -> Self {
        self.memory_used = self.spec.memory_mib - memory;
        self
    }
}

fn task(id: u64) -> TaskBuilder {
    TaskBuilder(TaskSpec::new(id, "default", 1))
}

#[derive(Clone)]
struct TaskBuilder(TaskSpec);

impl TaskBuilder {
    fn gpus(mut self, gpus: u32) -> Self {
        self.0.gpus = gpus;
        self.0.gpu_milli = if gpus == 0 { 0 } else { WHOLE_GPU_MILLI };
        self
    }
    fn milli(mut self, milli: u32) -> Self {
        self.0.gpus = 1;
        self.0.gpu_milli = milli;
        self
    }
    fn cpu(mut self, cpu: u64) -> Self {
        self.0.cpu_milli = cpu;
        self
    }
    fn memory(mut self, memory: u64) -> Self {
        self.0.memory_mib = memory;
        self
    }
    fn models(mut self, models: &[&str]) -> Self {
        self.0.gpu_models = models.iter().map(|m| (*m).to_owned()).collect();
        self
    }
}

/// A cluster of these nodes, in this order, with their shares already taken.
fn cluster(nodes: Vec<NodeBuilder>) -> Cluster {
    let mut cluster = Cluster::new();
    for n in nodes {
        let idx = cluster.add_node(n.spec);
        let gpus = n
            .free
            .unwrap_or_default()
            .iter()
            .enumerate()
            .filter(|(_, f)| **f < WHOLE_GPU_MILLI)
            .map(|(g, f)| (g as u32, WHOLE_GPU_MILLI - f))
            .collect();
        cluster.allocate(&Placement {
            shares: vec![NodeShare {
                node: idx,
                gpus,
                cpu_milli: n.cpu_used,
                memory_mib: n.memory_used,
                ..NodeShare::default()
            }],
        });
    }
    cluster
}

/// Where `policy` puts `task`: the node's name and the `(gpu, milli)` shares.
fn placed(
    policy: &dyn Policy,
    cluster: &Cluster,
    task: &TaskSpec,
) -> Option<(String, Vec<(u32, u32)>)> {
    let placement = policy.place(cluster, task)?;
    assert_eq!(placement.shares.len(), 1, "one node");
    let share = &placement.shares[0];
    Some((
        cluster.node(share.node).spec.name.clone(),
        share.gpus.clone(),
    ))
}

/// An FGD policy that has seen `history` submitted.
fn fgd_after(history: Vec<TaskBuilder>) -> Fgd {
    let mut fgd = Fgd::new();
    for t in history {
        fgd.observe_submitted(&t.0);
    }
    fgd
}

/// `n` tasks of one shape.
fn many(n: usize, shape: impl Fn() -> TaskBuilder) -> Vec<TaskBuilder> {
    (0..n).map(|_| shape()).collect()
}

struct Case {
    name: &'static str,
    nodes: Vec<NodeBuilder>,
    task: TaskBuilder,
    want: Option<(&'static str, Vec<(u32, u32)>)>,
}

fn check(policy: &dyn Policy, cases: Vec<Case>) {
    for case in cases {
        let cluster = cluster(case.nodes);
        let got = placed(policy, &cluster, &case.task.0);
        let want = case.want.map(|(n, g)| (n.to_owned(), g));
        assert_eq!(got, want, "{}: {}", policy.name(), case.name);
    }
}

// ---------------------------------------------------------------------------------------------
// bestfit

#[test]
fn bestfit_placement_table() {
    let cases = vec![
        Case {
            name: "a fraction goes to the tightest GPU that holds it",
            nodes: vec![node("n1").free(&[1000, 300, 600, 250])],
            task: task(1).milli(250),
            want: Some(("n1", vec![(3, 250)])),
        },
        Case {
            name: "a fraction goes to the node left with the least free GPU capacity",
            nodes: vec![node("n1").free(&[1000, 1000]), node("n2").free(&[500, 0])],
            task: task(1).milli(400),
            want: Some(("n2", vec![(0, 400)])),
        },
        Case {
            name: "fractional remainders count towards a node's free capacity",
            nodes: vec![
                node("n1").free(&[1000, 1000, 1000]),
                node("n2").free(&[1000, 1000, 200]),
            ],
            task: task(1).gpus(2),
            want: Some(("n2", vec![(0, 1000), (1, 1000)])),
        },
        Case {
            name: "whole GPUs only go to entirely free GPUs",
            nodes: vec![
                node("n1").free(&[900, 900, 900]),
                node("n2").free(&[1000, 1000]),
            ],
            task: task(1).gpus(1),
            want: Some(("n2", vec![(0, 1000)])),
        },
        Case {
            name: "the tightest node is skipped when its CPU is taken",
            nodes: vec![
                node("n1").free(&[300]).cpu_free(2_000),
                node("n2").free(&[1000]),
            ],
            task: task(1).milli(300).cpu(4_000),
            want: Some(("n2", vec![(0, 300)])),
        },
        Case {
            name: "the tightest node is skipped when its memory is taken",
            nodes: vec![
                node("n1").free(&[300]).memory_free(1_024),
                node("n2").free(&[1000]),
            ],
            task: task(1).milli(300).memory(4_096),
            want: Some(("n2", vec![(0, 300)])),
        },
        Case {
            name: "a task only goes to a GPU model it accepts",
            nodes: vec![
                node("n1").free(&[300]).model("T4"),
                node("n2").model("V100"),
            ],
            task: task(1).milli(300).models(&["V100"]),
            want: Some(("n2", vec![(0, 300)])),
        },
        Case {
            name: "a CPU-only task goes where it leaves no GPU stranded: a CPU-only node",
            nodes: vec![node("n1"), node("c1").cpu_only()],
            task: task(1).gpus(0).cpu(8_000),
            want: Some(("c1", vec![])),
        },
        Case {
            name: "equal fits go to the lowest index",
            nodes: vec![node("n1"), node("n2")],
            task: task(1).gpus(1),
            want: Some(("n1", vec![(0, 1000)])),
        },
        Case {
            name: "nothing is placed when no GPU holds the fraction",
            nodes: vec![node("n1").free(&[400, 0]), node("n2").free(&[300, 300])],
            task: task(1).milli(500),
            want: None,
        },
    ];
    check(&BestFit, cases);
}

// ---------------------------------------------------------------------------------------------
// fgd

#[test]
fn fgd_placement_table() {
    struct FgdCase {
        case: Case,
        history: Vec<TaskBuilder>,
        /// Where best fit puts the same task, to show where FGD differs.
        want_bestfit: Option<(&'static str, Vec<(u32, u32)>)>,
    }
    let cases = vec![
        FgdCase {
            case: Case {
                name: "a fraction takes the GPU whose leftover the popular half-GPU shape cannot \
                       use anyway, not the tightest one",
                nodes: vec![node("n1").free(&[600]), node("n2").free(&[1000])],
                task: task(1).milli(300),
                want: Some(("n2", vec![(0, 300)])),
            },
            history: many(10, || task(0).milli(500)),
            want_bestfit: Some(("n1", vec![(0, 300)])),
        },
        FgdCase {
            case: Case {
                name: "a fraction goes to an already shared GPU, keeping whole GPUs whole for the \
                       popular one-GPU shape",
                nodes: vec![
                    node("n1").free(&[1000, 1000, 1000, 300]),
                    node("n2").free(&[1000, 1000]),
                ],
                task: task(1).milli(250),
                want: Some(("n1", vec![(3, 250)])),
            },
            history: many(10, || task(0).gpus(1)),
            want_bestfit: Some(("n2", vec![(0, 250)])),
        },
        FgdCase {
            case: Case {
                name: "a CPU-only task leaves the CPU that the popular shape needs beside a free \
                       GPU",
                nodes: vec![
                    node("n1").free(&[1000]).cpu_free(8_000),
                    node("n2").free(&[1000, 1000]),
                ],
                task: task(1).gpus(0).cpu(8_000),
                want: Some(("n2", vec![])),
            },
            history: many(10, || task(0).gpus(1).cpu(8_000)),
            want_bestfit: Some(("n1", vec![])),
        },
        FgdCase {
            case: Case {
                name: "a one-GPU task keeps a pair of whole GPUs together for the popular \
                       two-GPU shape",
                nodes: vec![
                    node("n1").free(&[1000, 1000]),
                    node("n2").free(&[1000, 1000, 1000]),
                ],
                task: task(1).gpus(1),
                want: Some(("n2", vec![(0, 1000)])),
            },
            history: many(10, || task(0).gpus(2)),
            want_bestfit: Some(("n1", vec![(0, 1000)])),
        },
        FgdCase {
            case: Case {
                name: "popularity decides: the GPU that still holds the popular half-GPU shape \
                       afterwards is the one to share",
                nodes: vec![node("n1").free(&[800]), node("n2").free(&[600])],
                task: task(1).milli(150),
                want: Some(("n1", vec![(0, 150)])),
            },
            history: [
                many(9, || task(0).milli(500)),
                many(1, || task(0).milli(700)),
            ]
            .concat(),
            want_bestfit: Some(("n2", vec![(0, 150)])),
        },
        FgdCase {
            case: Case {
                name: "popularity decides: when seven-tenths tasks dominate, the GPU that could \
                       hold one is kept whole instead",
                nodes: vec![node("n1").free(&[800]), node("n2").free(&[600])],
                task: task(1).milli(150),
                want: Some(("n2", vec![(0, 150)])),
            },
            history: [
                many(1, || task(0).milli(500)),
                many(9, || task(0).milli(700)),
            ]
            .concat(),
            want_bestfit: Some(("n2", vec![(0, 150)])),
        },
        FgdCase {
            case: Case {
                name: "with no history it places like best fit",
                nodes: vec![node("n1").free(&[600]), node("n2").free(&[1000])],
                task: task(1).milli(300),
                want: Some(("n1", vec![(0, 300)])),
            },
            history: vec![],
            want_bestfit: Some(("n1", vec![(0, 300)])),
        },
        FgdCase {
            case: Case {
                name: "equal growth of fragmentation goes to the best fit",
                nodes: vec![node("n1"), node("n2").free(&[1000, 0]), node("n3")],
                task: task(1).gpus(1),
                want: Some(("n2", vec![(0, 1000)])),
            },
            history: many(10, || task(0).gpus(1)),
            want_bestfit: Some(("n2", vec![(0, 1000)])),
        },
        FgdCase {
            case: Case {
                name: "a model it does not accept is never a candidate",
                nodes: vec![
                    node("n1").free(&[600]).model("T4"),
                    node("n2").model("V100"),
                ],
                task: task(1).milli(300).models(&["T4"]),
                want: Some(("n1", vec![(0, 300)])),
            },
            history: many(10, || task(0).milli(500)),
            want_bestfit: Some(("n1", vec![(0, 300)])),
        },
    ];
    for FgdCase {
        case,
        history,
        want_bestfit,
    } in cases
    {
        let bestfit = placed(&BestFit, &cluster(case.nodes.clone()), &case.task.0);
        assert_eq!(
            bestfit,
            want_bestfit.map(|(n, g)| (n.to_owned(), g)),
            "bestfit: {}",
            case.name
        );
        check(&fgd_after(history), vec![case]);
    }
}

#[test]
fn fgd_learns_shapes_from_submissions_and_ignores_cpu_only_ones() {
    let fgd = fgd_after(vec![
        task(1).milli(500),
        task(2).milli(500),
        task(3).gpus(1).cpu(4_000),
        task(4).gpus(0).cpu(4_000),
        task(5).milli(500).models(&["T4", "T4"]),
    ]);
    assert_eq!(fgd.counts.len(), 3, "{:?}", fgd.counts);
    assert_eq!(fgd.rows("G2").len(), 2, "shapes that accept any model");
    assert_eq!(fgd.rows("T4").len(), 3, "and the one naming T4");
    assert!(fgd.parameters().contains("3 task shapes"));
}

#[test]
fn usable_capacity_counts_only_gpus_a_shape_fits_and_only_where_it_fits() {
    let fgd = fgd_after(vec![task(1).milli(500), task(2).gpus(2).cpu(10_000)]);
    let rows = fgd.rows("G2");
    // Half-GPU shape: the 600 and the 1000 hold it; two-GPU shape: only one whole GPU.
    assert_eq!(Fgd::usable(rows, &[1000, 600, 300], 64_000, 1 << 20), 1600);
    // Two whole GPUs: both shapes use both.
    assert_eq!(
        Fgd::usable(rows, &[1000, 1000], 64_000, 1 << 20),
        2000 + 2000
    );
    // Not enough CPU for the two-GPU shape.
    assert_eq!(Fgd::usable(rows, &[1000, 1000], 8_000, 1 << 20), 2000);
    // Nodes with more GPUs than the fast path holds agree with it.
    let free: Vec<u32> = (0..20)
        .map(|i| if i % 2 == 0 { 1000 } else { 400 })
        .collect();
    assert_eq!(
        Fgd::usable(rows, &free, 64_000, 1 << 20),
        Fgd::usable_slow(Measure::Reference, rows, &free, 64_000, 1 << 20)
    );
    assert_eq!(Fgd::usable(rows, &free, 64_000, 1 << 20), 10_000 + 10_000);
}

#[test]
fn a_task_larger_than_any_node_takes_whole_idle_nodes() {
    let cluster = cluster(vec![node("n1"), node("n2").free(&[1000, 500]), node("n3")]);
    for policy in [&BestFit as &dyn Policy, &Fgd::new()] {
        let placement = policy.place(&cluster, &task(1).gpus(4).0).expect("placed");
        let names: Vec<&str> = placement
            .shares
            .iter()
            .map(|s| cluster.node(s.node).spec.name.as_str())
            .collect();
        assert_eq!(names, ["n1", "n3"], "{}", policy.name());
    }
}

/// Found by the property `every_task_that_can_ever_run_eventually_finishes`: a node of another
/// model has enough GPUs but too little memory on each, so the task must span nodes of the model
/// whose GPUs have it.
#[test]
fn a_task_too_big_for_the_nodes_with_enough_memory_spans_them_even_if_a_smaller_gpu_node_is_large()
{
    let with_memory = |name: &str, model: &str, gpus: u32, mib: u64| {
        let mut n = node(name).model(model);
        n.spec.gpus = gpus;
        n.spec.gpu_memory_mib = mib;
        n
    };
    let cluster = cluster(vec![
        with_memory("a", "A100", 1, 0),
        with_memory("l", "L40S", 2, 24_576),
        with_memory("b", "A100", 1, 81_920),
    ]);
    let mut big = task(1).gpus(2).0;
    big.gpu_memory_mib = 65_536;
    for policy in [&BestFit as &dyn Policy, &Fgd::new()] {
        let placement = policy.place(&cluster, &big).expect("placed");
        let names: Vec<&str> = placement
            .shares
            .iter()
            .map(|s| cluster.node(s.node).spec.name.as_str())
            .collect();
        assert_eq!(names, ["a", "b"], "{}", policy.name());
    }
}

#[test]
fn a_task_that_does_not_fit_waits_without_blocking_the_ones_behind_it() {
    for policy in ["bestfit", "fgd"] {
        let mut s = Scheduler::new(crate::policy::by_name(policy).expect("known"));
        s.apply(Input::NodeAdded(NodeSpec::new("n1", 4, "G2")))
            .unwrap();
        let mut pass = |tasks: Vec<TaskBuilder>, at: Time| -> Vec<TaskId> {
            for t in tasks {
                s.apply(Input::TaskSubmitted { task: t.0, at }).unwrap();
            }
            s.apply(Input::Schedule { at })
                .unwrap()
                .into_iter()
                .filter_map(|d| match d {
                    Decision::Granted { task, .. } => Some(task),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(pass(vec![task(1).gpus(3)], 0), [TaskId(1)], "{policy}");
        let granted = pass(vec![task(2).gpus(2), task(3).milli(500)], 1);
        assert_eq!(granted, [TaskId(3)], "{policy}: task 3 starts past task 2");
        assert_eq!(s.pending(), 1, "{policy}: task 2 waits");
    }
}

// ---------------------------------------------------------------------------------------------
// host-aware measure (allot's placement)

#[test]
fn host_aware_usable_capacity_is_capped_by_what_free_cpu_and_memory_can_feed() {
    let fgd = fgd_after(many(3, || task(1).gpus(1).cpu(8_000).memory(16_384)));
    let rows = fgd.rows("G2");
    let usable = |free: &[u32], cpu, memory| {
        (
            Fgd::usable_by(Measure::Reference, rows, free, cpu, memory),
            Fgd::usable_by(Measure::HostAware, rows, free, cpu, memory),
        )
    };
    let four = [1000, 1000, 1000, 1000];
    assert_eq!(usable(&four, 64_000, 1 << 20), (3 * 4000, 3 * 4000));
    // 20 CPU feed 2.5 GPUs' worth of this shape; the paper's measure sees all four.
    assert_eq!(usable(&four, 20_000, 1 << 20), (3 * 4000, 3 * 2500));
    // Memory caps the same way.
    assert_eq!(usable(&four, 64_000, 32_768), (3 * 4000, 3 * 2000));
    // Too little for one task: nothing, under both.
    assert_eq!(usable(&four, 7_000, 1 << 20), (0, 0));
    // A node that does not track CPU or memory is not capped.
    assert_eq!(usable(&four, u64::MAX, u64::MAX), (3 * 4000, 3 * 4000));
    let free: Vec<u32> = vec![1000; 20];
    assert_eq!(
        Fgd::usable_by(Measure::HostAware, rows, &free, 40_000, 1 << 20),
        Fgd::usable_slow(Measure::HostAware, rows, &free, 40_000, 1 << 20)
    );
    assert_eq!(
        Fgd::usable_slow(Measure::HostAware, rows, &free, 40_000, 1 << 20),
        3 * 5000
    );
}

mod host_cap {
    use proptest::prelude::*;

    use super::*;

    /// The cap as first written: every product and quotient in 128 bits.
    fn cap_wide(row: &Row, usable: u64, cpu: u64, memory: u64) -> u64 {
        let demand = u128::from(row.gpus) * u128::from(row.gpu_milli);
        let mut capped = usable;
        for (free, need) in [(cpu, row.cpu_milli), (memory, row.memory_mib)] {
            if need > 0 && u128::from(free) * demand < u128::from(capped) * u128::from(need) {
                capped = (u128::from(free) * demand / u128::from(need)) as u64;
            }
        }
        capped
    }

    /// Host room as nodes report it, and the extremes: nothing, untracked (`u64::MAX`), and
    /// values whose products overflow 64 bits.
    fn amount() -> impl Strategy<Value = u64> {
        prop_oneof![
            0u64..200_000,
            0u64..(1 << 24),
            Just(u64::MAX),
            (1u64 << 40)..(1 << 62),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn the_64_bit_cap_answers_as_the_128_bit_one(
            gpus in prop_oneof![0u32..=16, Just(u32::MAX)],
            gpu_milli in prop_oneof![0u32..=1000, Just(u32::MAX)],
            cpu_milli in amount(),
            memory_mib in amount(),
            usable in prop_oneof![0u64..=16_000, amount()],
            cpu in amount(),
            memory in amount(),
        ) {
            let row = Row::new(gpu_milli, gpus, cpu_milli, memory_mib, 1);
            prop_assert_eq!(
                Measure::HostAware.cap(&row, usable, cpu, memory),
                cap_wide(&row, usable, cpu, memory)
            );
            prop_assert_eq!(Measure::Reference.cap(&row, usable, cpu, memory), usable);
        }
    }
}

#[test]
fn host_aware_fgd_keeps_cpu_hungry_tasks_off_nodes_whose_gpus_they_would_strand() {
    // Most tasks take a GPU and 8 CPU. A task with a GPU and 16 CPU on n1 (4 GPUs, 32 CPU)
    // would leave 3 GPUs with CPU for only 2 more; on n2 (64 CPU) it strands nothing.
    let history = many(10, || task(1).gpus(1).cpu(8_000));
    let nodes = || {
        cluster(vec![
            node("n1").free(&[1000; 4]).cpu_free(32_000),
            node("n2").free(&[1000; 4]),
        ])
    };
    let hungry = task(2).gpus(1).cpu(16_000).0;
    let reference = fgd_after(history.clone());
    let mut host_aware = Fgd::with_measure(Measure::HostAware);
    for t in &history {
        host_aware.observe_submitted(&t.0);
    }
    let on = |policy: &Fgd| placed(policy, &nodes(), &hungry).map(|(n, _)| n);
    assert_eq!(on(&reference).as_deref(), Some("n1"), "the paper's: a tie");
    assert_eq!(on(&host_aware).as_deref(), Some("n2"));
}

// ---------------------------------------------------------------------------------------------
// The incremental placer

mod incremental {
    use proptest::prelude::*;

    use super::*;

    /// A node: GPUs, model, free share of each GPU (as a step of 250), GPU memory tracked,
    /// CPU free (in 8-core steps), schedulable.
    type NodeCase = (u32, bool, Vec<u32>, bool, u64, bool);

    fn node_case() -> impl Strategy<Value = NodeCase> {
        prop_oneof![Just(1u32), Just(2), Just(4), Just(8)].prop_flat_map(|gpus| {
            (
                Just(gpus),
                any::<bool>(),
                proptest::collection::vec(0u32..=4, gpus as usize),
                any::<bool>(),
                0u64..=8,
                prop::bool::weighted(0.9),
            )
        })
    }

    /// A task shape: 0 (CPU only), a fraction, or whole GPUs; accepted models; CPU; GPU memory.
    fn shape() -> impl Strategy<Value = TaskSpec> {
        (
            prop_oneof![
                Just((0u32, 0u32)),
                (1u32..=3).prop_map(|q| (1, q * 250)),
                Just((1, 1000)),
                Just((2, 1000)),
                Just((4, 1000)),
                Just((8, 1000)),
            ],
            prop_oneof![Just(vec![]), Just(vec!["A"]), Just(vec!["B"])],
            0u64..=3,
            prop_oneof![Just(0u64), Just(20_000), Just(60_000)],
        )
            .prop_map(|((gpus, milli), models, cpu, gpu_memory)| {
                let mut t = TaskSpec::new(0, "t", gpus);
                t.gpu_milli = milli;
                t.gpu_models = models.into_iter().map(String::from).collect();
                t.cpu_milli = cpu * 8_000;
                t.gpu_memory_mib = if gpus == 0 { 0 } else { gpu_memory };
                t
            })
    }

    fn build(nodes: &[NodeCase]) -> Cluster {
        let mut cluster = Cluster::new();
        for (i, (gpus, b, free, memory, cpu_free, schedulable)) in nodes.iter().enumerate() {
            let idx = cluster.add_node(NodeSpec {
                name: format!("n{i}"),
                gpus: *gpus,
                gpu_model: if *b { "B" } else { "A" }.into(),
                gpu_memory_mib: if *memory { 80_000 } else { 0 },
                cpu_milli: 64_000,
                memory_mib: 262_144,
                ..NodeSpec::default()
            });
            cluster.allocate(&Placement {
                shares: vec![NodeShare {
                    node: idx,
                    gpus: free
                        .iter()
                        .enumerate()
                        .filter(|(_, f)| **f < 4)
                        .map(|(g, f)| (g as u32, WHOLE_GPU_MILLI - f * 250))
                        .collect(),
                    cpu_milli: 64_000 - cpu_free * 8_000,
                    ..NodeShare::default()
                }],
            });
            if !schedulable {
                cluster.set_schedulable(idx, false);
            }
        }
        cluster
    }

    /// FGD, under the host-aware measure or the paper's, after seeing `history` submitted.
    fn learned(history: &[TaskSpec], host_aware: bool) -> Fgd {
        let mut fgd = if host_aware {
            Fgd::with_measure(Measure::HostAware)
        } else {
            Fgd::new()
        };
        for t in history {
            fgd.observe_submitted(t);
        }
        fgd
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Asked among a set of nodes that holds every node that can take the task, FGD places
        /// it where it places it weighing the whole cluster; and it says the task fits anywhere
        /// exactly when that finds a placement.
        #[test]
        fn placing_among_the_nodes_that_can_hold_a_task_places_it_as_the_whole_cluster(
            nodes in proptest::collection::vec(node_case(), 1..24),
            history in proptest::collection::vec(shape(), 0..12),
            task in shape(),
            others in proptest::collection::vec(any::<bool>(), 24),
            host_aware in any::<bool>(),
        ) {
            let fgd = learned(&history, host_aware);
            let cluster = build(&nodes);
            let want = fgd.place(&cluster, &task);
            prop_assert_eq!(fgd.fits_anywhere(&cluster, &task), want.is_some());
            // Every node that could hold it, and some that cannot.
            let request = Request::of(&cluster, &task);
            let among: Vec<NodeIdx> = (0..cluster.nodes().len())
                .map(|i| NodeIdx(i as u32))
                .filter(|idx| feasible(cluster.node(*idx), &task, request) || others[idx.0 as usize])
                .collect();
            prop_assert_eq!(fgd.place_among(&cluster, &task, &among), want);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// What FGD remembers of a node state, brought up to date as it learns more tasks
        /// (of shapes new and seen, naming models or not, many at a time), is what it works
        /// out afresh from every shape learnt so far.
        #[test]
        fn remembered_usable_capacity_is_what_it_works_out_afresh(
            nodes in proptest::collection::vec(node_case(), 1..6),
            steps in proptest::collection::vec((shape(), 0usize..6, 0usize..=12), 1..80),
            host_aware in any::<bool>(),
        ) {
            let mut fgd = learned(&[], host_aware);
            let cluster = build(&nodes);
            for (task, pick, times) in steps {
                // Mostly asked again after a task or two; now and then after many.
                let times = if times > 9 { times * 4 } else { times / 4 };
                for _ in 0..times {
                    fgd.observe_submitted(&task);
                }
                let node = cluster.node(NodeIdx((pick % nodes.len()) as u32));
                let (scope, rows) = fgd.scoped_rows(&node.spec.gpu_model);
                let (cpu, memory) = node.host_free();
                let free = node.free_desc();
                prop_assert_eq!(
                    fgd.remembered_usable(scope, rows, free, cpu, memory),
                    Fgd::usable_by(fgd.measure, rows, free, cpu, memory)
                );
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Placing tasks of a few shapes one after another — each placement taken, now and
        /// then an earlier one given back — the incremental placers, told only which nodes
        /// changed, place every task exactly where FGD places it from scratch.
        #[test]
        fn places_exactly_as_fgd_from_scratch(
            nodes in proptest::collection::vec(node_case(), 1..24),
            history in proptest::collection::vec(shape(), 1..12),
            shapes in proptest::collection::vec(shape(), 1..4),
            steps in proptest::collection::vec((0usize..4, prop::bool::weighted(0.2)), 1..40),
            host_aware in any::<bool>(),
        ) {
            let fgd = learned(&history, host_aware);
            let mut cluster = build(&nodes);
            let mut placers: Vec<Option<(Option<Incremental>, usize)>> =
                (0..shapes.len()).map(|_| None).collect();
            let mut changed: Vec<NodeIdx> = Vec::new();
            let mut taken: Vec<Placement> = Vec::new();
            for (pick, give_back) in steps {
                if give_back && !taken.is_empty() {
                    let placement = taken.remove(pick % taken.len());
                    cluster.release(&placement);
                    changed.extend(placement.shares.iter().map(|s| s.node));
                    continue;
                }
                let i = pick % shapes.len();
                let task = &shapes[i];
                let want = fgd.place(&cluster, task);
                let (placer, seen) = placers[i]
                    .get_or_insert_with(|| (Incremental::new(&fgd, &cluster, task), changed.len()));
                let got = match placer {
                    Some(placer) => {
                        placer.update(&fgd, &cluster, &changed[*seen..]);
                        *seen = changed.len();
                        placer.place(&cluster)
                    }
                    None => fgd.place(&cluster, task),
                };
                prop_assert_eq!(&got, &want);
                if let Some(placement) = got {
                    cluster.allocate(&placement);
                    changed.extend(placement.shares.iter().map(|s| s.node));
                    taken.push(placement);
                }
            }
        }
    }
}

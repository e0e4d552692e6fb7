//! Packing policies for clusters whose GPUs are shared: [`BestFit`] and [`Fgd`].
//!
//! Both start pending tasks first come, first served, and a task that does not fit waits without
//! holding up the tasks behind it ([`WhenBlocked::Continue`]). They differ only in where a task
//! goes, and both consider the same placements: a task that fits on one node goes to one node —
//! a GPU fraction to one GPU whose free share holds it, whole GPUs to GPUs that are entirely free,
//! a CPU-only task to CPU and memory alone — and it needs the node's CPU and memory and a GPU
//! model it accepts. A task larger than every node takes whole idle nodes, as
//! [`placement::best_fit`] places it.
//!
//! - [`BestFit`] packs: the node left with the least free GPU capacity (milli-GPU, fractional
//!   remainders included), and on it the tightest GPU for a fraction — the FGD paper's BestFit
//!   baseline, on GPUs alone.
//! - [`Fgd`] (Fragmentation Gradient Descent, Weng et al., "Beware of Fragmentation", ATC'23)
//!   places where the node's expected GPU fragmentation, measured against the task shapes seen
//!   so far, grows least. Its [`Measure`] is the paper's; `allot` places with the same descent
//!   under [`Measure::HostAware`], which also counts GPUs that a node's remaining CPU and memory
//!   can no longer feed.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::ops::ControlFlow;

use rustc_hash::FxHashMap as HashMap;
use smallvec::SmallVec;

use crate::cluster::{Cluster, NodeShare, NodeState, Placement};
use crate::model::{NodeIdx, RequestShape as Shape, TaskSpec, Time, WHOLE_GPU_MILLI};
use crate::placement;
use crate::policy::{PendingView, Policy, QueueKey, WhenBlocked};

/// Pure packing: the feasible node left with the least free GPU capacity after placement, and on
/// it the tightest GPU for a fraction; ties go to the lowest node, then GPU, index.
///
/// The FGD paper's BestFit scores CPU and GPU left over with equal weights
/// (`pkg/simulator/plugin/best_fit_score.go` in hkust-adsl/kubernetes-scheduler-simulator); this
/// one scores GPUs alone, as BASELINES.md defines it: CPU and memory only have to fit.
#[derive(Debug, Clone, Copy, Default)]
pub struct BestFit;

impl Policy for BestFit {
    fn name(&self) -> &'static str {
        "bestfit"
    }
    fn key(&self, task: PendingView<'_>, _now: Time) -> QueueKey {
        QueueKey(task.submitted as i64, 0, task.seq)
    }
    fn when_blocked(&self) -> WhenBlocked {
        WhenBlocked::Continue
    }
    fn one_node(&self, cluster: &Cluster, task: &TaskSpec) -> bool {
        Request::of(cluster, task) != Request::Spanning
    }
    fn place(&self, cluster: &Cluster, task: &TaskSpec) -> Option<Placement> {
        let request = Request::of(cluster, task);
        if request == Request::Spanning {
            return placement::best_fit(cluster, task);
        }
        let mut best: Option<(Fit, Choice)> = None;
        for_each_feasible(cluster, task, request, |idx, node| {
            let free = node_free(node);
            let (fit, choice) = match request {
                Request::Fraction(milli) => {
                    let (gpu, gpu_free) = tightest_gpu(node, milli, task.gpu_memory_mib);
                    (
                        Fit {
                            node_free_after: free - u64::from(milli),
                            gpu_free_after: gpu_free - milli,
                        },
                        Choice::Gpu(idx, gpu),
                    )
                }
                _ => (
                    Fit {
                        node_free_after: free - task.gpu_demand_milli(),
                        gpu_free_after: 0,
                    },
                    Choice::Node(idx),
                ),
            };
            if best.as_ref().is_none_or(|b| (fit, choice) < *b) {
                best = Some((fit, choice));
            }
        });
        best.map(|(_, choice)| choice.placement(cluster, task))
    }
    fn parameters(&self) -> String {
        "order=submit time; a task that does not fit waits without blocking; \
         placement=least free GPU capacity left on the node, tightest GPU for a fraction"
            .into()
    }
}

/// Fragmentation Gradient Descent: of all placements of a task, the one that increases the
/// expected GPU fragmentation of its node least, measured against the distribution of task
/// shapes submitted so far; ties go to the best fit ([`BestFit`]'s order), then the lowest node
/// and GPU index.
///
/// Learned from the reference implementation, hkust-adsl/kubernetes-scheduler-simulator:
/// `pkg/simulator/plugin/fgd_score.go` (score = fragmentation before − after, per node and, for
/// a fraction, per GPU) and `pkg/utils/frag.go` (`NodeGpuShareFragAmount`, `GetNodePodFrag`):
///
/// - A shape m (GPU count, milli-GPU per GPU, accepted models, CPU, memory) **fits** a node when
///   the node has an accepted model, m's CPU and memory are free, and at least m's GPU count of
///   GPUs each have m's milli-GPU free.
/// - The node's fragmentation **for m** is all its free GPU capacity when m does not fit;
///   otherwise the free capacity of the GPUs whose free share is below m's per-GPU request (a
///   whole-GPU shape cannot use any partly used GPU).
/// - The node's **expected** fragmentation is Σₘ popularity(m) × frag(node, m).
///
/// Writing frag(node, m) = free(node) − usable(node, m), where usable is what m could use,
/// the growth of fragmentation of a placement is −demand × Σₘ popularity(m) + (loss of
/// Σₘ popularity(m) × usable(node, m)); the first term is the same for every placement of the
/// task, so this policy minimises the loss of popularity-weighted usable capacity, in exact
/// integer arithmetic (task counts × milli-GPU).
///
/// Where this differs from the reference, on purpose: the distribution is learned online from
/// [`Policy::observe_submitted`] rather than fixed from the whole trace up front, and it keeps
/// every shape rather than the most popular ones covering 95% of pods; memory counts in a
/// shape's fit (the reference's measure tracks CPU only, though its scheduler enforces memory); CPU-only shapes are left out of the distribution — wherever a
/// task goes they see all free GPU capacity as fragmented, so they shift every placement's score
/// by the same amount; and ties are broken by best fit and index instead of the reference's
/// integer-rounded scores and random choice among equal nodes.
#[derive(Debug, Clone, Default)]
pub struct Fgd {
    /// How fragmentation is measured ([`Measure::Reference`] for the paper's FGD).
    measure: Measure,
    /// Task counts per shape.
    counts: BTreeMap<Shape, u64>,
    /// The shapes accepting any model, by per-GPU request.
    rows_any: Vec<Row>,
    /// For each model some shape names: its scope and the shapes accepting that model, by
    /// per-GPU request.
    rows_by_model: HashMap<String, (Scope, Vec<Row>)>,
    /// Each model some shape names, by its scope (numbered from 1 as they are first named).
    scopes: HashMap<String, Scope>,
    /// Weighted usable capacities worked out so far, by node state.
    memo: RefCell<Memo>,
}

/// What [`Fgd`] counts as the GPU capacity a node still offers a task shape m (the rest of its
/// free GPU capacity is fragmented for m).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Measure {
    /// The paper's: when m fits the node (CPU, memory, an accepted model, enough GPUs with m's
    /// per-GPU request free), the free capacity of the GPUs holding that request; else nothing.
    #[default]
    Reference,
    /// The paper's, capped by the GPU capacity the node's free CPU and memory can still
    /// accompany at m's own ratio: min(free CPU × m's GPU demand / m's CPU, the same for
    /// memory). A GPU whose node has run out of CPU or memory for m is stranded for m even when
    /// one task of m would still fit; the paper's measure sees it as usable until the very last
    /// task, so it lets CPU-hungry tasks use up the host resources of GPU-rich nodes.
    HostAware,
}

impl Measure {
    /// `usable` milli-GPU for `row`, capped by the most GPU capacity that `cpu` and `memory`
    /// free can accompany at its ratio (⌊free × its GPU demand ÷ its need⌋ for each).
    /// Divides only where the cap bites: ⌊x ÷ n⌋ < u exactly when x < u × n, and most nodes
    /// have host room to spare (this runs for every shape of every node state FGD scores).
    /// In 64 bits where the products fit (every real node: milli-cores and MiB times at most
    /// a few thousand milli-GPU), in 128 where they do not (a node that does not track CPU or
    /// memory has `u64::MAX` of it): the same answer, without a 128-bit division per row.
    #[inline(always)]
    fn cap(self, row: &Row, usable: u64, cpu: u64, memory: u64) -> u64 {
        if self == Self::Reference {
            return usable;
        }
        let demand = row.demand;
        // Every factor below 2^32 (every real node and shape): no product can overflow, so
        // neither is checked — one test for all of them instead of one per product (the
        // shape's half of it made with the row).
        if row.narrow && (cpu | memory | usable) >> 32 == 0 {
            let mut capped = usable;
            // A need of 0 caps nothing: nothing is below 0.
            let fed = cpu * demand;
            if fed < capped * row.cpu_milli {
                capped = fed / row.cpu_milli;
            }
            let fed = memory * demand;
            if fed < capped * row.memory_mib {
                capped = fed / row.memory_mib;
            }
            return capped;
        }
        let mut capped = usable;
        for (free, need) in [(cpu, row.cpu_milli), (memory, row.memory_mib)] {
            if need == 0 {
                continue;
            }
            match (free.checked_mul(demand), capped.checked_mul(need)) {
                (Some(fed), Some(most)) => {
                    if fed < most {
                        capped = fed / need;
                    }
                }
                _ => {
                    let fed = u128::from(free) * u128::from(demand);
                    if fed < u128::from(capped) * u128::from(need) {
                        // Below `capped`, so it fits in a u64.
                        capped = (fed / u128::from(need)) as u64;
                    }
                }
            }
        }
        capped
    }
}

/// A shape with its count, laid out for the fragmentation loop.
#[derive(Debug, Clone, Copy)]
struct Row {
    gpu_milli: u32,
    gpus: u32,
    cpu_milli: u64,
    memory_mib: u64,
    count: u64,
    /// Its GPU demand, milli-GPU (at most 2^32 × 2^32: fits).
    demand: u64,
    /// Its CPU, memory and GPU demand are each below 2^32 ([`Measure::cap`] multiplies them in
    /// 64 bits when the node's amounts are too): asked once per row, not once per node state.
    narrow: bool,
}

impl Row {
    fn new(gpu_milli: u32, gpus: u32, cpu_milli: u64, memory_mib: u64, count: u64) -> Self {
        let demand = u64::from(gpus) * u64::from(gpu_milli);
        Self {
            gpu_milli,
            gpus,
            cpu_milli,
            memory_mib,
            count,
            demand,
            narrow: (cpu_milli | memory_mib | demand) >> 32 == 0,
        }
    }

    fn of(shape: &Shape, count: u64) -> Self {
        Self::new(
            shape.gpu_milli,
            shape.gpus,
            shape.cpu_milli,
            shape.memory_mib,
            count,
        )
    }
}

impl Fgd {
    /// An FGD policy that has seen no tasks yet (it places by best fit until it has).
    pub fn new() -> Self {
        Self::default()
    }

    /// An FGD placer that measures fragmentation by `measure`.
    pub fn with_measure(measure: Measure) -> Self {
        Self {
            measure,
            ..Self::default()
        }
    }

    /// The shapes that accept GPUs of `model`, by per-GPU request, and which they are.
    fn scoped_rows(&self, model: &str) -> (Scope, &[Row]) {
        match self.rows_by_model.get(model) {
            Some((scope, rows)) => (*scope, rows),
            None => (memo::ANY, &self.rows_any),
        }
    }

    /// The shapes that accept GPUs of `model`, by per-GPU request.
    #[cfg(test)]
    fn rows(&self, model: &str) -> &[Row] {
        self.scoped_rows(model).1
    }

    fn rebuild_rows(&mut self) {
        let row = Row::of;
        let by_request = |rows: &mut Vec<Row>| rows.sort_unstable_by_key(|r| r.gpu_milli);
        self.rows_any = self
            .counts
            .iter()
            .filter(|(s, _)| s.gpu_models.is_empty())
            .map(|(s, c)| row(s, *c))
            .collect();
        by_request(&mut self.rows_any);
        self.rows_by_model.clear();
        let named: Vec<&String> = self.counts.keys().flat_map(|s| &s.gpu_models).collect();
        for model in named {
            if self.rows_by_model.contains_key(model) {
                continue;
            }
            let mut rows: Vec<Row> = self
                .counts
                .iter()
                .filter(|(s, _)| s.gpu_models.is_empty() || s.gpu_models.contains(model))
                .map(|(s, c)| row(s, *c))
                .collect();
            by_request(&mut rows);
            self.rows_by_model
                .insert(model.clone(), (self.scopes[model], rows));
        }
    }

    /// [`Self::usable_by`] under the paper's measure.
    #[cfg(test)]
    fn usable(rows: &[Row], free: &[u32], cpu: u64, memory: u64) -> u64 {
        Self::usable_by(Measure::Reference, rows, free, cpu, memory)
    }

    /// Popularity-weighted usable GPU capacity of a node whose GPUs have `free` milli-GPU free
    /// (largest first) and that has `cpu` and `memory` free: Σₘ count(m) × usable(node, m),
    /// usable as `measure` counts it.
    fn usable_by(measure: Measure, rows: &[Row], free: &[u32], cpu: u64, memory: u64) -> u64 {
        // usable(node, m) = the free capacity of the GPUs holding m's per-GPU request, when at
        // least m's GPU count of them do; with `free` sorted, those are a prefix of it, which
        // shrinks as the request grows. The host-aware measure caps each term by what the free
        // CPU and memory can accompany.
        let mut prefix = [0u64; 17];
        let prefix: &mut [u64] = if free.len() < prefix.len() {
            &mut prefix[..=free.len()]
        } else {
            return Self::usable_slow(measure, rows, free, cpu, memory);
        };
        for (i, f) in free.iter().enumerate() {
            prefix[i + 1] = prefix[i] + u64::from(*f);
        }
        // One loop per measure: the measure is not asked row by row.
        match measure {
            Measure::Reference => {
                Self::sum_rows(rows, free, prefix, cpu, memory, |_, usable| usable)
            }
            Measure::HostAware => Self::sum_rows(rows, free, prefix, cpu, memory, |row, usable| {
                Measure::HostAware.cap(row, usable, cpu, memory)
            }),
        }
    }

    /// [`Self::usable_by`]'s sum over `rows`, given the prefix sums of `free`, with each term
    /// capped by `cap`.
    #[inline(always)]
    fn sum_rows(
        rows: &[Row],
        free: &[u32],
        prefix: &[u64],
        cpu: u64,
        memory: u64,
        cap: impl Fn(&Row, u64) -> u64,
    ) -> u64 {
        let mut holding = free.len();
        let mut usable = 0;
        for row in rows {
            while holding > 0 && free[holding - 1] < row.gpu_milli {
                holding -= 1;
            }
            if holding == 0 {
                break;
            }
            if row.gpus as usize <= holding && row.cpu_milli <= cpu && row.memory_mib <= memory {
                usable += row.count * cap(row, prefix[holding]);
            }
        }
        usable
    }

    /// [`Self::usable_by`] the shapes `rows` of `scope`, under this policy's measure, as
    /// remembered ([`Memo`]).
    fn remembered_usable(
        &self,
        scope: Scope,
        rows: &[Row],
        free: &[u32],
        cpu: u64,
        memory: u64,
    ) -> u64 {
        let measure = self.measure;
        self.memo
            .borrow_mut()
            .usable(measure, scope, free, cpu, memory, || {
                Self::usable_by(measure, rows, free, cpu, memory)
            })
    }

    /// The loss of usable capacity of each way to place `task` on a node whose GPUs have `free`
    /// milli-GPU free (largest first), weighed against the shapes `rows` of `scope`, appended
    /// to `out` as `(free share of the GPU used, loss)`: one entry per distinct free share that
    /// holds a fraction, a single one (share 0) for whole GPUs, taken from the entirely free
    /// ones, or for CPU only.
    #[allow(clippy::too_many_arguments)]
    fn losses(
        &self,
        (scope, rows): (Scope, &[Row]),
        free: &[u32],
        cpu: u64,
        memory: u64,
        task: &TaskSpec,
        request: Request,
        out: &mut Vec<(u32, u64)>,
    ) {
        let before = self.remembered_usable(scope, rows, free, cpu, memory);
        let (cpu, memory) = (
            cpu.saturating_sub(task.cpu_milli),
            memory.saturating_sub(task.memory_mib),
        );
        let mut after = Vec::with_capacity(free.len());
        let loss = |after: &[u32]| {
            before
                - self
                    .remembered_usable(scope, rows, after, cpu, memory)
                    .min(before)
        };
        match request {
            Request::Fraction(milli) => {
                for (i, share) in free.iter().copied().enumerate() {
                    if share < milli || (i > 0 && free[i - 1] == share) {
                        continue;
                    }
                    after.clear();
                    after.extend_from_slice(free);
                    after[i] -= milli;
                    after.sort_unstable_by(|a, b| b.cmp(a));
                    out.push((share, loss(&after)));
                }
            }
            Request::Whole(gpus) => {
                after.extend_from_slice(&free[gpus as usize..]);
                after.resize(free.len(), 0);
                out.push((0, loss(&after)));
            }
            Request::Host => out.push((0, loss(free))),
            Request::Spanning => {}
        }
    }

    /// [`Self::usable_by`] for nodes with more GPUs than its stack buffer holds.
    fn usable_slow(measure: Measure, rows: &[Row], free: &[u32], cpu: u64, memory: u64) -> u64 {
        rows.iter()
            .filter(|r| r.cpu_milli <= cpu && r.memory_mib <= memory)
            .map(|r| {
                let holding = free.iter().filter(|f| **f >= r.gpu_milli);
                if holding.clone().count() >= r.gpus as usize {
                    let usable = holding.map(|f| u64::from(*f)).sum::<u64>();
                    r.count * measure.cap(r, usable, cpu, memory)
                } else {
                    0
                }
            })
            .sum()
    }
}

impl Policy for Fgd {
    fn name(&self) -> &'static str {
        "fgd"
    }
    fn key(&self, task: PendingView<'_>, _now: Time) -> QueueKey {
        QueueKey(task.submitted as i64, 0, task.seq)
    }
    fn when_blocked(&self) -> WhenBlocked {
        WhenBlocked::Continue
    }
    fn observe_submitted(&mut self, task: &TaskSpec) {
        if task.gpus == 0 {
            return;
        }
        let shape = Shape::of(task);
        let mut scopes = Vec::with_capacity(shape.gpu_models.len());
        for model in &shape.gpu_models {
            let next = self.scopes.len() as Scope + 1;
            scopes.push(*self.scopes.entry(model.clone()).or_insert(next));
        }
        let row = Row::of(&shape, 1);
        *self.counts.entry(shape).or_default() += 1;
        self.memo.get_mut().learnt(row, scopes);
        self.rebuild_rows();
    }
    fn one_node(&self, cluster: &Cluster, task: &TaskSpec) -> bool {
        Request::of(cluster, task) != Request::Spanning
    }
    fn place(&self, cluster: &Cluster, task: &TaskSpec) -> Option<Placement> {
        let request = Request::of(cluster, task);
        if request == Request::Spanning {
            return placement::best_fit(cluster, task);
        }
        let mut best = Best::new(self, task, request);
        for_each_feasible(cluster, task, request, |idx, node| best.weigh(idx, node));
        best.placement(cluster)
    }
    fn packer(&self) -> Option<&Fgd> {
        Some(self)
    }
    fn parameters(&self) -> String {
        format!(
            "order=submit time; a task that does not fit waits without blocking; \
             placement=least growth of expected GPU fragmentation against {} task shapes seen \
             so far, then best fit",
            self.counts.len()
        )
    }
}

/// A placement's rank: the loss of expected usable capacity, then how tight it is, then where.
type Candidate = (u64, Fit, Choice);

impl Fgd {
    /// What placing `task` on a node in `state` loses, per distinct GPU share it could go on
    /// (see [`Fgd::losses`]), appended to `out`.
    fn node_losses(
        &self,
        rows: (Scope, &[Row]),
        state: NodeKey<'_>,
        task: &TaskSpec,
        request: Request,
        out: &mut Vec<(u32, u64)>,
    ) {
        self.losses(
            rows,
            state.free,
            state.cpu,
            state.memory,
            task,
            request,
            out,
        );
    }
}

impl Fgd {
    /// Where [`Policy::place`] puts `task`, given that no node outside `nodes` can hold it
    /// (those nodes alone changed since it fitted nowhere): the same placement, from those
    /// nodes' evaluation instead of the whole cluster's. A placement's rank names its node, so
    /// which other nodes are looked at cannot change the best one.
    pub fn place_among(
        &self,
        cluster: &Cluster,
        task: &TaskSpec,
        nodes: &[NodeIdx],
    ) -> Option<Placement> {
        let request = Request::of(cluster, task);
        if request == Request::Spanning {
            return self.place(cluster, task);
        }
        let mut best = Best::new(self, task, request);
        for &idx in nodes {
            let node = cluster.node(idx);
            if feasible(node, task, request) {
                best.weigh(idx, node);
            }
        }
        best.placement(cluster)
    }

    /// Whether [`Policy::place`] would find `task` a placement: some node can hold it on its
    /// own (every such node offers at least one placement), asked without weighing any and
    /// answered at the first.
    pub fn fits_anywhere(&self, cluster: &Cluster, task: &TaskSpec) -> bool {
        let request = Request::of(cluster, task);
        if request == Request::Spanning {
            return self.place(cluster, task).is_some();
        }
        try_each_feasible(cluster, task, request, |_, _| ControlFlow::Break(())).is_break()
    }
}

/// The best placement of one task among the feasible nodes [`Best::weigh`] is shown, as
/// [`Fgd::place`] ranks them. Nodes in the same state lose the same for the same task, so each
/// state is evaluated once (a full cluster has hundreds of feasible nodes but only about a
/// hundred states).
struct Best<'c> {
    fgd: &'c Fgd,
    task: &'c TaskSpec,
    request: Request,
    best: Option<Candidate>,
    evaluated: HashMap<NodeKey<'c>, (usize, usize)>,
    losses: Vec<(u32, u64)>,
    rows: ModelRows<'c>,
}

impl<'c> Best<'c> {
    fn new(fgd: &'c Fgd, task: &'c TaskSpec, request: Request) -> Self {
        Self {
            fgd,
            task,
            request,
            best: None,
            evaluated: HashMap::default(),
            losses: Vec::new(),
            rows: ModelRows::default(),
        }
    }

    /// Weighs the placements on `node` (at `idx`), which can hold the task.
    fn weigh(&mut self, idx: NodeIdx, node: &'c NodeState) {
        let rows = self.rows.of(self.fgd, node);
        let state = NodeKey::of(rows.1, node);
        let (from, to) = match self.evaluated.get(&state) {
            Some(range) => *range,
            None => {
                let from = self.losses.len();
                self.fgd
                    .node_losses(rows, state, self.task, self.request, &mut self.losses);
                self.evaluated.insert(state, (from, self.losses.len()));
                (from, self.losses.len())
            }
        };
        let best = &mut self.best;
        candidates(
            idx,
            node,
            self.task,
            self.request,
            &self.losses[from..to],
            |c| {
                if best.as_ref().is_none_or(|b| c < *b) {
                    *best = Some(c);
                }
            },
        );
    }

    /// The best placement weighed, if any.
    fn placement(self, cluster: &Cluster) -> Option<Placement> {
        self.best
            .map(|(_, _, choice)| choice.placement(cluster, self.task))
    }
}

/// Looks each model's rows up once per run of nodes of equal models.
#[derive(Default)]
struct ModelRows<'p> {
    last: Option<(&'p str, (Scope, &'p [Row]))>,
}

impl<'p> ModelRows<'p> {
    fn of(&mut self, fgd: &'p Fgd, node: &'p NodeState) -> (Scope, &'p [Row]) {
        let model = node.spec.gpu_model.as_str();
        match self.last {
            Some((m, rows)) if std::ptr::eq(m, model) || m == model => rows,
            _ => {
                let rows = fgd.scoped_rows(model);
                self.last = Some((model, rows));
                rows
            }
        }
    }
}

/// The placements of `task` on the feasible node `idx`, one per entry of `losses` (its
/// state's losses) that the node can take, each ranked, handed to `take` in turn.
fn candidates(
    idx: NodeIdx,
    node: &NodeState,
    task: &TaskSpec,
    request: Request,
    losses: &[(u32, u64)],
    mut take: impl FnMut(Candidate),
) {
    let free = node_free(node);
    for &(gpu_free, loss) in losses {
        let (fit, choice) = match request {
            Request::Fraction(milli) => {
                // Any GPU with this much free compute loses the same; it must also have the
                // memory.
                let gpu = (0..node.gpu_free.len()).find(|g| {
                    node.gpu_free[*g] == gpu_free && node.gpu_fits(*g, milli, task.gpu_memory_mib)
                });
                let Some(gpu) = gpu else {
                    continue;
                };
                (
                    Fit {
                        node_free_after: free - u64::from(milli),
                        gpu_free_after: gpu_free - milli,
                    },
                    Choice::Gpu(idx, gpu as u32),
                )
            }
            _ => (
                Fit {
                    node_free_after: free - task.gpu_demand_milli(),
                    gpu_free_after: 0,
                },
                Choice::Node(idx),
            ),
        };
        take((loss, fit, choice));
    }
}

/// [`Fgd::place`] for many tasks of one shape while the cluster changes under them: every
/// feasible node's best placement is ranked once, and afterwards only the nodes that changed
/// are looked at again, so a further placement costs a few nodes' evaluation instead of the
/// whole cluster's. Only a node's best is kept: the best of all is the best of some node, and
/// keeping the others (a fraction has one per distinct free share) cost an allocation per
/// node for nothing. It places exactly as [`Fgd::place`] would on the cluster as it is,
/// provided that every node changed since it was built is named to
/// [`Incremental::update`] before it is asked, and that the policy (the `fgd` each call is
/// handed, always the same) has learnt no new task shape since: the scheduler keeps placers
/// within one sweep of a pass, and one pass's preload holds.
#[derive(Debug)]
pub struct Incremental {
    task: TaskSpec,
    request: Request,
    /// Every feasible node's best placement, the best of all on top (a candidate names its
    /// node, so no two nodes' are equal and the order is total). A node's entry that
    /// `by_node` no longer holds is stale: left in place, and dropped when it comes to the
    /// top, which costs less than taking it out of an ordered set at once.
    ranked: BinaryHeap<Reverse<Candidate>>,
    /// Each node's current entry in `ranked`, by node index.
    by_node: Vec<Option<Candidate>>,
    /// The node states evaluated, by their hash: each one's key and where its losses are in
    /// `losses`. A key is made (and allocated) only for a state not seen before.
    evaluated: HashMap<u64, SmallVec<[Evaluated; 1]>>,
    /// The losses of every state evaluated, one after another.
    losses: Vec<(u32, u64)>,
}

/// A node state evaluated: its key, and where its losses are.
type Evaluated = (OwnedKey, (usize, usize));

/// A [`NodeKey`] that outlives the cluster's borrow.
#[derive(Debug, Clone, PartialEq, Eq)]
struct OwnedKey {
    rows: usize,
    cpu: u64,
    memory: u64,
    hash: u64,
    free: Box<[u32]>,
}

impl OwnedKey {
    fn of(state: &NodeKey<'_>) -> Self {
        Self {
            rows: state.rows,
            cpu: state.cpu,
            memory: state.memory,
            hash: state.hash,
            free: state.free.into(),
        }
    }

    /// Whether `state` is the state this is the key of.
    fn is(&self, state: &NodeKey<'_>) -> bool {
        self.hash == state.hash
            && self.rows == state.rows
            && self.cpu == state.cpu
            && self.memory == state.memory
            && *self.free == *state.free
    }
}

impl Incremental {
    /// A placer for tasks of `task`'s shape as `fgd` places them; `None` for a task FGD does
    /// not place on one node's GPUs (spanning nodes, a MIG instance).
    pub fn new(fgd: &Fgd, cluster: &Cluster, task: &TaskSpec) -> Option<Self> {
        let request = Request::of(cluster, task);
        if request == Request::Spanning || task.mig_profile.is_some() {
            return None;
        }
        let mut incremental = Self {
            task: task.clone(),
            request,
            ranked: Default::default(),
            by_node: vec![None; cluster.nodes().len()],
            evaluated: HashMap::default(),
            losses: Vec::new(),
        };
        let mut feasible = Vec::new();
        for_each_feasible(cluster, task, request, |idx, _| feasible.push(idx));
        // Every node's best, then the heap made of them at once (in linear time) rather than
        // by as many pushes.
        let mut best = Vec::with_capacity(feasible.len());
        for idx in feasible {
            best.extend(incremental.best_on(fgd, cluster, idx).map(Reverse));
        }
        incremental.ranked = BinaryHeap::from(best);
        Some(incremental)
    }

    /// The best placement on the feasible node `idx` as it is now, if it offers any, noted
    /// as the node's current entry (but not pushed on `ranked`).
    fn best_on(&mut self, fgd: &Fgd, cluster: &Cluster, idx: NodeIdx) -> Option<Candidate> {
        let node = cluster.node(idx);
        let rows = fgd.scoped_rows(node.spec.gpu_model.as_str());
        let state = NodeKey::of(rows.1, node);
        let seen = self
            .evaluated
            .entry(state.hash ^ state.rows as u64)
            .or_default();
        let (from, to) = match seen.iter().find(|(key, _)| key.is(&state)) {
            Some((_, range)) => *range,
            None => {
                let from = self.losses.len();
                fgd.node_losses(rows, state, &self.task, self.request, &mut self.losses);
                seen.push((OwnedKey::of(&state), (from, self.losses.len())));
                (from, self.losses.len())
            }
        };
        let mut best: Option<Candidate> = None;
        candidates(
            idx,
            node,
            &self.task,
            self.request,
            &self.losses[from..to],
            |c| {
                if best.is_none_or(|b| c < b) {
                    best = Some(c);
                }
            },
        );
        let i = idx.0 as usize;
        if self.by_node.len() <= i {
            self.by_node.resize(i + 1, None);
        }
        self.by_node[i] = best;
        best
    }

    /// Takes in that the nodes `changed` changed on `cluster`. A node may be named twice: the
    /// first pass forgets it once, the second ranks it once (a node that offers no placement,
    /// ranked again, adds nothing).
    pub fn update(&mut self, fgd: &Fgd, cluster: &Cluster, changed: &[NodeIdx]) {
        for idx in changed {
            if let Some(entry) = self.by_node.get_mut(idx.0 as usize) {
                *entry = None;
            }
        }
        for idx in changed {
            let ranked = matches!(self.by_node.get(idx.0 as usize), Some(Some(_)));
            if !ranked
                && feasible(cluster.node(*idx), &self.task, self.request)
                && let Some(c) = self.best_on(fgd, cluster, *idx)
            {
                self.ranked.push(Reverse(c));
            }
        }
    }

    /// Where [`Fgd::place`] would put the task on `cluster` now.
    pub fn place(&mut self, cluster: &Cluster) -> Option<Placement> {
        while let Some(Reverse(top)) = self.ranked.peek() {
            let (_, _, choice) = *top;
            if self.by_node[choice.node().0 as usize] == Some(*top) {
                return Some(choice.placement(cluster, &self.task));
            }
            self.ranked.pop();
        }
        None
    }
}

/// A node's state as far as fragmentation goes: its shapes (by the address of their rows),
/// free CPU and memory, and free milli-GPU per GPU, largest first — all kept by the cluster,
/// with their hash ([`NodeState::state_hash`]), so a node's key costs no sorting or hashing.
#[derive(Debug, Clone, Copy)]
struct NodeKey<'c> {
    rows: usize,
    cpu: u64,
    memory: u64,
    free: &'c [u32],
    hash: u64,
}

impl<'c> NodeKey<'c> {
    fn of(rows: &[Row], node: &'c NodeState) -> Self {
        let (cpu, memory) = node.host_free();
        Self {
            rows: rows.as_ptr() as usize,
            cpu,
            memory,
            free: node.free_desc(),
            hash: node.state_hash(),
        }
    }
}

impl PartialEq for NodeKey<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash
            && self.rows == other.rows
            && self.cpu == other.cpu
            && self.memory == other.memory
            && self.free == other.free
    }
}

impl Eq for NodeKey<'_> {}

impl std::hash::Hash for NodeKey<'_> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // Equal keys have equal hashes (the cluster's hash covers every field but the rows,
        // which follow from the model).
        state.write_u64(self.hash ^ self.rows as u64);
    }
}

/// What a task asks of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Request {
    /// CPU and memory only.
    Host,
    /// A share of one GPU, milli-GPU.
    Fraction(u32),
    /// Whole GPUs on one node.
    Whole(u32),
    /// More whole GPUs than any node of an accepted model has.
    Spanning,
}

impl Request {
    fn of(cluster: &Cluster, task: &TaskSpec) -> Self {
        if task.gpus == 0 {
            Self::Host
        } else if task.gpus == 1 && task.gpu_milli < WHOLE_GPU_MILLI {
            Self::Fraction(task.gpu_milli)
        } else {
            let largest = cluster
                .models()
                .filter(|m| task.accepts(m.name))
                .map(|m| cluster.max_gpus(m))
                .max()
                .unwrap_or(0);
            // A node big enough whose GPUs lack the memory asked cannot hold the task whole:
            // it spans nodes of a model that can (as `placement::best_fit` places it).
            let one_node_can = || {
                task.gpu_memory_mib == 0
                    || cluster.nodes().iter().any(|n| {
                        n.spec.gpus >= task.gpus
                            && task.accepts(&n.spec.gpu_model)
                            && placement::fits_gpu_memory(n, task)
                    })
            };
            if task.gpus <= largest && one_node_can() {
                Self::Whole(task.gpus)
            } else {
                Self::Spanning
            }
        }
    }
}

/// How tight a placement is: less free GPU capacity left on the node, then on the GPU, is
/// tighter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Fit {
    node_free_after: u64,
    gpu_free_after: u32,
}

/// A placement on one node: the node (whole GPUs or none), or the node and the GPU (a
/// fraction). Ordered by node index, then GPU index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Choice {
    Node(NodeIdx),
    Gpu(NodeIdx, u32),
}

impl Choice {
    /// The node it is on.
    fn node(self) -> NodeIdx {
        match self {
            Self::Node(node) | Self::Gpu(node, _) => node,
        }
    }

    fn placement(self, cluster: &Cluster, task: &TaskSpec) -> Placement {
        let (node, gpus, gpu_memory_mib) = match self {
            Self::Gpu(node, gpu) => (node, vec![(gpu, task.gpu_milli)], task.gpu_memory_mib),
            Self::Node(node) => {
                let state = cluster.node(node);
                (node, state.free_gpus(task.gpus), state.spec.gpu_memory_mib)
            }
        };
        Placement {
            shares: vec![NodeShare {
                node,
                gpus,
                gpu_memory_mib,
                cpu_milli: task.cpu_milli,
                memory_mib: task.memory_mib,
                ..NodeShare::default()
            }],
        }
    }
}

/// Calls `visit` for every schedulable node that can hold `request` on its own: CPU and memory
/// free, an accepted model, and GPU room (entirely free GPUs for whole GPUs, one GPU with the
/// share free for a fraction).
fn for_each_feasible<'c>(
    cluster: &'c Cluster,
    task: &TaskSpec,
    request: Request,
    mut visit: impl FnMut(NodeIdx, &'c NodeState),
) {
    let _ = try_each_feasible(cluster, task, request, |idx, node| {
        visit(idx, node);
        ControlFlow::Continue(())
    });
}

/// [`for_each_feasible`], stopping at the first node for which `visit` breaks.
fn try_each_feasible<'c>(
    cluster: &'c Cluster,
    task: &TaskSpec,
    request: Request,
    mut visit: impl FnMut(NodeIdx, &'c NodeState) -> ControlFlow<()>,
) -> ControlFlow<()> {
    match request {
        Request::Spanning => {}
        Request::Whole(gpus) => {
            // The cluster indexes schedulable nodes by entirely free GPUs: on a full cluster
            // only a few nodes are worth a look.
            for model in cluster.models() {
                if !task.accepts(model.name) {
                    continue;
                }
                for free in gpus..=cluster.max_gpus(model) {
                    for idx in cluster.nodes_with_free(model, free) {
                        let node = cluster.node(idx);
                        if host_fits(node, task) && placement::fits_gpu_memory(node, task) {
                            visit(idx, node)?;
                        }
                    }
                }
            }
        }
        Request::Host | Request::Fraction(_) => {
            for (i, node) in cluster.nodes().iter().enumerate() {
                if feasible(node, task, request) {
                    visit(NodeIdx(i as u32), node)?;
                }
            }
        }
    }
    ControlFlow::Continue(())
}

/// Whether `node` can hold `request` on its own: what [`for_each_feasible`] visits.
fn feasible(node: &NodeState, task: &TaskSpec, request: Request) -> bool {
    if !node.schedulable || !host_fits(node, task) {
        return false;
    }
    match request {
        Request::Spanning => false,
        Request::Host => true,
        Request::Whole(gpus) => {
            task.accepts(&node.spec.gpu_model)
                && node.free_whole >= gpus
                && placement::fits_gpu_memory(node, task)
        }
        Request::Fraction(milli) => {
            task.accepts(&node.spec.gpu_model)
                && (0..node.gpu_free.len()).any(|g| node.gpu_fits(g, milli, task.gpu_memory_mib))
        }
    }
}

/// Whether the node's free CPU and memory hold the task's.
fn host_fits(node: &NodeState, task: &TaskSpec) -> bool {
    let (cpu, memory) = node.host_free();
    cpu >= task.cpu_milli && memory >= task.memory_mib
}

/// Free milli-GPU on the node.
fn node_free(node: &NodeState) -> u64 {
    node.gpu_free.iter().map(|f| u64::from(*f)).sum()
}

/// The GPU with the smallest free share that still holds `milli` (lowest index on ties), and
/// its free share.
fn tightest_gpu(node: &NodeState, milli: u32, memory_mib: u64) -> (u32, u32) {
    node.gpu_free
        .iter()
        .enumerate()
        .filter(|(g, _)| node.gpu_fits(*g, milli, memory_mib))
        .min_by_key(|(i, f)| (**f, *i))
        .map(|(i, f)| (i as u32, *f))
        .unwrap_or((0, WHOLE_GPU_MILLI))
}

mod memo;
#[cfg(test)]
mod tests;

use memo::{Memo, Scope};

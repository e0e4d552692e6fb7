//! Every check a spec must pass before it is published, with every problem collected.
//!
//! # Rules
//!
//! - `metadata.name`: 1-48 characters from a-z, A-Z, 0-9, '-' and '_' (the workload id adds a
//!   hash to it); `team`, `project`, task and gang names: subject tokens (1-64 such characters).
//! - `team` must be listed in the teams file (when one is given); `priorityClass` must be one
//!   of its classes (by default `batch`, `standard`, `critical`).
//! - The spec: at most 512 KiB as written and as published, at most 1,000 tasks
//!   ([`crate::limits`]).
//! - At least one task; task names unique; `command` names a program.
//! - Resources: at most one of `gpus`, `gpuFraction`, `gpuMilli`, `migProfile`; quantities
//!   parse strictly; `gpuMemory` and `gpuModels` only with a GPU request.
//! - Durations (`durationEstimate`, `maxRuntime`, `retry.backoff`, `checkpoint.interval`) are
//!   humantime, longer than zero and at most 365 days ([`limits::MAX_DURATION`]); `deadline` is
//!   such a duration after submission or an RFC 3339 time; `retry.maxAttempts` ≥ 1; a
//!   checkpoint `interval` needs `supported: true`.
//! - `after` names tasks of the workload; the tasks form no cycle (printed `a -> b -> c -> a`).
//! - Gangs (tasks with the same `gang`) start together, so: at least two members; every
//!   member makes the **same GPU request** (`gpus`/`gpuFraction`/`gpuMilli`/`migProfile`,
//!   `gpuMemory`, and the set of `gpuModels`) — they are interchangeable workers placed side by
//!   side, while CPU and memory may differ (a coordinator may need more); no member waits for
//!   another, directly or not; and, against a cluster, the whole gang fits in the GPUs of the
//!   models it accepts.
//! - Against a cluster: some node shape can hold each task (a task larger than one node needs
//!   enough whole nodes of one shape, as the scheduler places it).

use std::collections::{BTreeMap, BTreeSet};

use allot_events::subject::validate_token;
use allot_events::workload::{Resources, Task, Workload};
use allot_sched::model::{DagFacts, WHOLE_GPU_MILLI, mig_milli};

use crate::cluster::{ClusterShape, NodeShape};
use crate::dag::Dag;
use crate::limits;
use crate::parse::{Format, parse};
use crate::problem::{ProblemKind, SpecProblem, task_path};
use crate::quantity;
use crate::teams::TeamsConfig;

/// The longest workload name: the id appends `-` and 10 hex digits and stays a subject token.
pub const MAX_NAME_LEN: usize = 48;

/// What a spec is checked against.
#[derive(Debug, Clone, Copy, Default)]
pub struct Context<'a> {
    /// The teams file; `None`: teams are not checked and the default priority classes apply.
    pub teams: Option<&'a TeamsConfig>,
    /// The cluster; `None`: requests are not checked against node capacity.
    pub cluster: Option<&'a ClusterShape>,
}

/// A spec that passed every check, with what the checks worked out.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
    /// The workload as written (unknown fields are an error, so nothing was dropped).
    pub workload: Workload,
    /// Its priority, from its class.
    pub priority: i32,
    /// Each task's request, by task name.
    pub requests: BTreeMap<String, Request>,
    /// Each task's place in the DAG, by task name.
    pub dag: BTreeMap<String, DagFacts>,
}

/// Parses and validates `text`: the workload, or every problem found.
pub fn check(text: &str, format: Format, ctx: Context<'_>) -> Result<Checked, Vec<SpecProblem>> {
    if text.len() > limits::MAX_SPEC_BYTES {
        return Err(vec![limits::too_large(limits::SpecSize::Bytes(
            text.len() as u64
        ))]);
    }
    let parsed = parse(text, format);
    let mut problems = parsed.problems;
    let Some(workload) = parsed.workload else {
        return Err(problems);
    };
    problems.extend(validate(&workload, ctx));
    if !problems.is_empty() {
        return Err(problems);
    }
    let classes = ctx.teams.cloned().unwrap_or_default();
    let priority = classes
        .priority(workload.metadata.priority_class.as_deref())
        .expect("validated: the class exists");
    let requests = workload
        .spec
        .tasks
        .iter()
        .map(|t| {
            let request = Request::of(&t.resources).expect("validated: the resources parse");
            (t.name.clone(), request)
        })
        .collect();
    let dag = Dag::of(&workload).facts().expect("validated: no cycle");
    Ok(Checked {
        workload,
        priority,
        requests,
        dag,
    })
}

/// A task's resources in the scheduler's units (the fields of `allot_sched::TaskSpec`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Request {
    /// Whole GPUs, or 1 with `gpu_milli` < 1000 for a share; 0 for a CPU-only task.
    pub gpus: u32,
    /// Milli-GPU per GPU (1000 for whole GPUs).
    pub gpu_milli: u32,
    /// GPU memory per GPU, MiB (0: any).
    pub gpu_memory_mib: u64,
    /// Accepted GPU models (empty: any).
    pub gpu_models: Vec<String>,
    /// A MIG profile instead of GPUs.
    pub mig_profile: Option<String>,
    /// CPU, millicores (0: not tracked).
    pub cpu_milli: u64,
    /// Memory, MiB (0: not tracked).
    pub memory_mib: u64,
    /// The predictor's right-sizing may replace the GPU model, share and memory.
    pub right_size: bool,
}

impl Request {
    /// Parses a task's resources; on failure, every `(field, message)` wrong with them.
    pub fn of(r: &Resources) -> Result<Self, Vec<(&'static str, String)>> {
        let mut errors = Vec::new();
        let mut req = Request {
            gpu_milli: WHOLE_GPU_MILLI,
            gpu_models: r.gpu_models.clone(),
            ..Request::default()
        };
        let gpu_fields: Vec<&str> = [
            ("gpus", r.gpus.is_some()),
            ("gpuFraction", r.gpu_fraction.is_some()),
            ("gpuMilli", r.gpu_milli.is_some()),
            ("migProfile", r.mig_profile.is_some()),
        ]
        .into_iter()
        .filter_map(|(f, set)| set.then_some(f))
        .collect();
        if gpu_fields.len() > 1 {
            errors.push((
                gpu_fields[1],
                format!(
                    "give only one of gpus, gpuFraction, gpuMilli and migProfile (found {})",
                    gpu_fields.join(" and ")
                ),
            ));
        }
        if let Some(q) = &r.gpus {
            match quantity::whole_gpus(q.as_str()) {
                Ok(g) => req.gpus = g,
                Err(e) => errors.push(("gpus", e)),
            }
        }
        if let Some(q) = &r.gpu_fraction {
            match quantity::gpu_fraction_milli(q.as_str()) {
                Ok(m) => (req.gpus, req.gpu_milli) = (1, m),
                Err(e) => errors.push(("gpuFraction", e)),
            }
        }
        if let Some(m) = r.gpu_milli {
            if (1..WHOLE_GPU_MILLI).contains(&m) {
                (req.gpus, req.gpu_milli) = (1, m);
            } else {
                errors.push((
                    "gpuMilli",
                    format!("{m} is not between 1 and 999; use gpus for whole GPUs"),
                ));
            }
        }
        if let Some(p) = &r.mig_profile {
            match mig_milli(p).filter(|_| p.ends_with("gb") && p.contains(".")) {
                Some(m) => {
                    (req.gpus, req.gpu_milli) = (1, m);
                    req.mig_profile = Some(p.clone());
                }
                None => errors.push((
                    "migProfile",
                    format!("{p:?} is not a MIG profile: use <slices>g.<memory>gb, e.g. \"1g.10gb\" or \"3g.40gb\""),
                )),
            }
        }
        if let Some(q) = &r.gpu_memory {
            match quantity::memory_mib(q.as_str()) {
                Ok(m) => req.gpu_memory_mib = m,
                Err(e) => errors.push(("gpuMemory", e)),
            }
        }
        if let Some(q) = &r.cpu {
            match quantity::cpu_milli(q.as_str()) {
                Ok(m) => req.cpu_milli = m,
                Err(e) => errors.push(("cpu", e)),
            }
        }
        if let Some(q) = &r.memory {
            match quantity::memory_mib(q.as_str()) {
                Ok(m) => req.memory_mib = m,
                Err(e) => errors.push(("memory", e)),
            }
        }
        let no_gpu = gpu_fields.is_empty() || (r.gpus.is_some() && req.gpus == 0);
        if no_gpu && r.gpu_memory.is_some() {
            errors.push((
                "gpuMemory",
                "is set but the task requests no GPU".to_owned(),
            ));
        }
        if no_gpu && !r.gpu_models.is_empty() {
            errors.push((
                "gpuModels",
                "is set but the task requests no GPU".to_owned(),
            ));
        }
        if r.gpu_models.iter().any(|m| m.trim().is_empty()) {
            errors.push(("gpuModels", "a model name is empty".to_owned()));
        }
        if r.right_size {
            if no_gpu {
                errors.push((
                    "rightSize",
                    "is set but the task requests no GPU: there is nothing to right-size"
                        .to_owned(),
                ));
            } else if r.mig_profile.is_some() {
                errors.push((
                    "rightSize",
                    "cannot resize a MIG instance: ask for gpus or gpuFraction instead".to_owned(),
                ));
            }
            req.right_size = true;
        }
        if errors.is_empty() {
            Ok(req)
        } else {
            Err(errors)
        }
    }

    /// `4 GPUs (H100) with 40960 MiB each, 8 CPU, 65536 MiB memory`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        match (&self.mig_profile, self.gpus, self.gpu_milli) {
            (Some(p), _, _) => parts.push(format!("one MIG {p} instance")),
            (None, 0, _) => {}
            (None, 1, m) if m < WHOLE_GPU_MILLI => parts.push(format!("{m} milli-GPU")),
            (None, 1, _) => parts.push("1 GPU".to_owned()),
            (None, g, _) => parts.push(format!("{g} GPUs")),
        }
        if self.gpus > 0 && !self.gpu_models.is_empty() {
            parts
                .last_mut()
                .expect("a GPU part")
                .push_str(&format!(" of {}", self.gpu_models.join(" or ")));
        }
        if self.gpu_memory_mib > 0 {
            parts.push(format!("{} MiB GPU memory", self.gpu_memory_mib));
        }
        if self.cpu_milli > 0 {
            parts.push(format!("{}m CPU", self.cpu_milli));
        }
        if self.memory_mib > 0 {
            parts.push(format!("{} MiB memory", self.memory_mib));
        }
        if parts.is_empty() {
            "nothing tracked".to_owned()
        } else {
            parts.join(", ")
        }
    }

    /// Why a node of `shape` can never hold this request, or `None` if one can.
    fn misfit(&self, shape: &NodeShape) -> Option<String> {
        if self.gpus > 0 {
            if shape.gpus == 0 {
                return Some("no GPUs".to_owned());
            }
            if !self.gpu_models.is_empty()
                && !shape.gpu_model.is_empty()
                && !self.gpu_models.contains(&shape.gpu_model)
            {
                return Some(format!("model {} not accepted", shape.gpu_model));
            }
            if let (Some(profile), Some(mig)) = (&self.mig_profile, &shape.mig)
                && mig.get(profile).copied().unwrap_or(0) == 0
            {
                return Some(format!("no MIG {profile} instances"));
            }
            if shape.gpu_memory_mib > 0 && self.gpu_memory_mib > shape.gpu_memory_mib {
                return Some(format!("{} MiB per GPU", shape.gpu_memory_mib));
            }
            if self.gpus > shape.gpus {
                // Larger than a node: the scheduler takes whole nodes of one shape.
                let needed = self.gpus.div_ceil(shape.gpus);
                return (needed > shape.count).then(|| {
                    format!(
                        "{} GPUs per node, {} nodes ({} needed)",
                        shape.gpus, shape.count, needed
                    )
                });
            }
        }
        if shape.cpu_milli > 0 && self.cpu_milli > shape.cpu_milli {
            return Some(format!("{}m CPU per node", shape.cpu_milli));
        }
        if shape.memory_mib > 0 && self.memory_mib > shape.memory_mib {
            return Some(format!("{} MiB memory per node", shape.memory_mib));
        }
        None
    }

    /// The same GPU request (what a gang's members must share).
    fn gpu_class(&self) -> (u32, u32, Option<&str>, u64, BTreeSet<&str>) {
        (
            self.gpus,
            self.gpu_milli,
            self.mig_profile.as_deref(),
            self.gpu_memory_mib,
            self.gpu_models.iter().map(String::as_str).collect(),
        )
    }
}

/// Every problem with `workload` that its types do not rule out.
pub fn validate(workload: &Workload, ctx: Context<'_>) -> Vec<SpecProblem> {
    let mut out = Vec::new();
    limits::workload(workload, &mut out);
    metadata(workload, ctx, &mut out);
    let tasks = &workload.spec.tasks;
    if tasks.len() > limits::MAX_TASKS {
        // Too many to be one workload: the count is the problem to fix first, and checking
        // each of them (gangs compare members pairwise) is work no answer needs.
        return out;
    }
    if tasks.is_empty() {
        out.push(SpecProblem::new(
            ProblemKind::Structure,
            "spec.tasks",
            "a workload needs at least one task",
        ));
    }

    let mut first_index: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, task) in tasks.iter().enumerate() {
        let at = task_path(i);
        let problem = |kind, field: &str, message: String| {
            SpecProblem::new(kind, format!("{at}.{field}"), message).in_task(&task.name)
        };
        if let Err(e) = validate_token("task name", &task.name) {
            out.push(problem(ProblemKind::Name, "name", e.to_string()));
        }
        match first_index.get(task.name.as_str()) {
            Some(first) => out.push(problem(
                ProblemKind::DuplicateTask,
                "name",
                format!(
                    "duplicate task name {:?} (also {})",
                    task.name,
                    task_path(*first)
                ),
            )),
            None => {
                first_index.insert(&task.name, i);
            }
        }
        if task.command.first().is_none_or(|p| p.trim().is_empty()) {
            out.push(problem(
                ProblemKind::Name,
                "command",
                "must name a program: an argv list such as [\"python\", \"train.py\"]".to_owned(),
            ));
        }
        if let Err(errors) = Request::of(&task.resources) {
            for (field, message) in errors {
                out.push(problem(
                    ProblemKind::Resources,
                    &format!("resources.{field}"),
                    message,
                ));
            }
        }
        durations(task, &mut |field, message| {
            out.push(problem(ProblemKind::Resources, field, message))
        });
        if let Some(gang) = &task.gang
            && let Err(e) = validate_token("gang", gang)
        {
            out.push(problem(ProblemKind::Name, "gang", e.to_string()));
        }
    }

    // Dependencies: names first, then cycles among the known ones.
    for (i, task) in tasks.iter().enumerate() {
        for (j, dep) in task.after.iter().enumerate() {
            if !first_index.contains_key(dep.as_str()) {
                let names: Vec<String> = first_index.keys().map(|k| (*k).to_owned()).collect();
                let hint = closest(dep, &names)
                    .map(|n| format!(" (did you mean {n:?}?)"))
                    .unwrap_or_default();
                out.push(
                    SpecProblem::new(
                        ProblemKind::UnknownDependency,
                        format!("{}.after[{j}]", task_path(i)),
                        format!("unknown task {dep:?}{hint}"),
                    )
                    .in_task(&task.name),
                );
            }
        }
    }
    let dag = Dag::of(workload);
    let cycles = dag.cycles();
    for cycle in &cycles {
        let first = &cycle[0];
        let i = first_index[first.as_str()];
        out.push(
            SpecProblem::new(
                ProblemKind::Cycle,
                format!("{}.after", task_path(i)),
                format!(
                    "dependency cycle: {} (each task waits for the one before it)",
                    cycle.join(" -> ")
                ),
            )
            .in_task(first),
        );
    }

    // In a cycle every task waits for every other; the cycle is the one problem to report.
    gangs(workload, cycles.is_empty().then_some(&dag), ctx, &mut out);
    if let Some(cluster) = ctx.cluster {
        capacity(workload, cluster, &mut out);
    }
    out
}

fn metadata(workload: &Workload, ctx: Context<'_>, out: &mut Vec<SpecProblem>) {
    let m = &workload.metadata;
    if let Err(e) = validate_token("workload name", &m.name) {
        out.push(SpecProblem::new(
            ProblemKind::Name,
            "metadata.name",
            e.to_string(),
        ));
    } else if m.name.len() > MAX_NAME_LEN {
        out.push(SpecProblem::new(
            ProblemKind::Name,
            "metadata.name",
            format!(
                "{:?} is {} characters long; at most {MAX_NAME_LEN}",
                m.name,
                m.name.len()
            ),
        ));
    }
    if let Err(e) = validate_token("team", &m.team) {
        out.push(SpecProblem::new(
            ProblemKind::Name,
            "metadata.team",
            e.to_string(),
        ));
    } else if let Some(teams) = ctx.teams.filter(|t| t.lists_teams())
        && teams.team(&m.team).is_none()
    {
        let names: Vec<String> = teams.teams.iter().map(|t| t.name.clone()).collect();
        let hint = closest(&m.team, &names)
            .map(|n| format!(" (did you mean {n:?}?)"))
            .unwrap_or_default();
        out.push(SpecProblem::new(
            ProblemKind::UnknownTeam,
            "metadata.team",
            format!(
                "unknown team {:?}{hint}; known teams: {}",
                m.team,
                names.join(", ")
            ),
        ));
    }
    if let Some(project) = &m.project
        && let Err(e) = validate_token("project", project)
    {
        out.push(SpecProblem::new(
            ProblemKind::Name,
            "metadata.project",
            e.to_string(),
        ));
    }
    let defaults = TeamsConfig::default();
    let classes = ctx.teams.unwrap_or(&defaults);
    if let Some(class) = &m.priority_class
        && classes.priority(Some(class)).is_none()
    {
        out.push(SpecProblem::new(
            ProblemKind::UnknownPriorityClass,
            "metadata.priorityClass",
            format!(
                "unknown priority class {class:?}; known classes: {}",
                classes.class_list()
            ),
        ));
    }
}

fn durations(task: &Task, report: &mut dyn FnMut(&str, String)) {
    for (field, value) in [
        ("durationEstimate", &task.duration_estimate),
        ("maxRuntime", &task.max_runtime),
        (
            "retry.backoff",
            &task.retry.as_ref().and_then(|r| r.backoff.clone()),
        ),
        (
            "checkpoint.interval",
            &task.checkpoint.as_ref().and_then(|c| c.interval.clone()),
        ),
    ] {
        if let Some(text) = value
            && let Err(e) = quantity::duration(text)
        {
            report(field, e);
        }
    }
    if let Some(text) = &task.deadline
        && let Err(e) = quantity::deadline(text)
    {
        report("deadline", e);
    }
    if let Some(retry) = &task.retry
        && retry.max_attempts == 0
    {
        report(
            "retry.maxAttempts",
            "must be at least 1 (the first run counts)".to_owned(),
        );
    }
    if let Some(c) = &task.checkpoint
        && !c.supported
        && c.interval.is_some()
    {
        report(
            "checkpoint.interval",
            "is set but checkpoint.supported is false".to_owned(),
        );
    }
}

fn gangs(workload: &Workload, dag: Option<&Dag>, ctx: Context<'_>, out: &mut Vec<SpecProblem>) {
    let mut members: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, task) in workload.spec.tasks.iter().enumerate() {
        if let Some(gang) = &task.gang {
            members.entry(gang).or_default().push(i);
        }
    }
    let tasks = &workload.spec.tasks;
    for (gang, idx) in members {
        let first = idx[0];
        let at = |i: usize| format!("{}.gang", task_path(i));
        if idx.len() < 2 {
            out.push(
                SpecProblem::new(
                    ProblemKind::Gang,
                    at(first),
                    format!(
                        "gang {gang:?} has one member; a gang is two or more tasks that start \
                         together (remove `gang` or add members)"
                    ),
                )
                .in_task(&tasks[first].name),
            );
            continue;
        }
        for &i in idx.iter().filter(|&&i| tasks[i].resources.right_size) {
            out.push(
                SpecProblem::new(
                    ProblemKind::Gang,
                    format!("{}.resources.rightSize", task_path(i)),
                    format!(
                        "gang {gang:?} members cannot be right-sized: the advice is per task \
                         and would split the request its members must share"
                    ),
                )
                .in_task(&tasks[i].name),
            );
        }
        let requests: Vec<Option<Request>> = idx
            .iter()
            .map(|&i| Request::of(&tasks[i].resources).ok())
            .collect();
        if let Some(lead) = &requests[0] {
            for (k, &i) in idx.iter().enumerate().skip(1) {
                if let Some(r) = &requests[k]
                    && r.gpu_class() != lead.gpu_class()
                {
                    out.push(
                        SpecProblem::new(
                            ProblemKind::Gang,
                            format!("{}.resources", task_path(i)),
                            format!(
                                "gang {gang:?} members must make the same GPU request: {:?} asks \
                                 for {}, {:?} for {}",
                                tasks[first].name,
                                lead.describe(),
                                tasks[i].name,
                                r.describe()
                            ),
                        )
                        .in_task(&tasks[i].name),
                    );
                }
            }
        }
        for &i in &idx {
            for &j in &idx {
                if dag.is_some_and(|d| d.waits_for(&tasks[i].name, &tasks[j].name)) {
                    out.push(
                        SpecProblem::new(
                            ProblemKind::Gang,
                            format!("{}.after", task_path(i)),
                            format!(
                                "waits for {:?}, a member of its own gang {gang:?}; members \
                                 start together, so none may wait for another",
                                tasks[j].name
                            ),
                        )
                        .in_task(&tasks[i].name),
                    );
                }
            }
        }
        if let Some(cluster) = ctx.cluster
            && let Some(Some(lead)) = requests.first()
            && lead.gpus > 0
        {
            let need: u64 = u64::from(lead.gpus) * u64::from(lead.gpu_milli) * idx.len() as u64;
            let have: u64 = cluster
                .nodes
                .iter()
                .filter(|n| {
                    lead.misfit(&NodeShape {
                        count: u32::MAX,
                        ..(*n).clone()
                    })
                    .is_none()
                })
                .map(|n| u64::from(n.count) * u64::from(n.gpus) * u64::from(WHOLE_GPU_MILLI))
                .sum();
            // When no node fits even one member, the members' own problems say why.
            if have > 0 && need > have {
                out.push(
                    SpecProblem::new(
                        ProblemKind::Unsatisfiable,
                        at(first),
                        format!(
                            "gang {gang:?} needs {} GPUs at once ({} members × {}); the nodes \
                             that fit its members have {} GPUs ({})",
                            need as f64 / 1000.0,
                            idx.len(),
                            lead.describe(),
                            have / 1000,
                            cluster.describe()
                        ),
                    )
                    .in_task(&tasks[first].name),
                );
            }
        }
    }
}

fn capacity(workload: &Workload, cluster: &ClusterShape, out: &mut Vec<SpecProblem>) {
    for (i, task) in workload.spec.tasks.iter().enumerate() {
        let Ok(request) = Request::of(&task.resources) else {
            continue;
        };
        let misfits: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| {
                request
                    .misfit(n)
                    .map(|why| format!("{}: {why}", n.describe()))
            })
            .collect::<Option<Vec<_>>>()
            .unwrap_or_default();
        if !misfits.is_empty() || cluster.nodes.is_empty() {
            let why = if cluster.nodes.is_empty() {
                "the cluster has no nodes".to_owned()
            } else {
                misfits.join("; ")
            };
            out.push(
                SpecProblem::new(
                    ProblemKind::Unsatisfiable,
                    format!("{}.resources", task_path(i)),
                    format!(
                        "no node could ever run this task, which needs {}: {why}",
                        request.describe()
                    ),
                )
                .in_task(&task.name),
            );
        }
    }
}

fn closest<'a>(word: &str, candidates: &'a [String]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|c| (crate::parse::edit_distance(word, c), c))
        .filter(|(d, c)| *d > 0 && *d <= 2.max(c.len() / 4))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c.as_str())
}

#[cfg(test)]
mod tests;

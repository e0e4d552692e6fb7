//! Named scenarios: a trace, the cluster it runs on and the teams' quotas, fixed so results
//! can be compared across policies, runs and machines — and, for `pipelines`, the DAG its jobs
//! follow.

use std::collections::BTreeMap;
use std::path::Path;

use allot_sched::NodeSpec;

use crate::load::philly;
use crate::pipelines::{self, Dag, Params, PipelineError};
use crate::trace::{LoadError, Trace};

/// A trace with its cluster and quotas.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Name, as on the command line.
    pub name: String,
    /// The jobs.
    pub trace: Trace,
    /// The cluster.
    pub nodes: Vec<NodeSpec>,
    /// Nominal quota per team, GPUs.
    pub nominal: BTreeMap<String, u32>,
    /// Which jobs wait for which (`None`: every job arrives at its submit time).
    pub dag: Option<Dag>,
}

/// `philly-640` (DESIGN.md): Philly jobs submitted 2017-10-01 to 2017-11-30 by the 11 VCs of
/// `vc_nodes.csv` (68,503 jobs) on one pool of 80 nodes × 8 GPUs; team = VC, nominal quota
/// proportional to the VC's node count.
pub fn philly_640(traces: &Path) -> Result<Scenario, LoadError> {
    let dir = traces.join("philly");
    let trace = philly::load(
        &dir.join("jobs.csv"),
        &dir.join("vc_nodes.csv"),
        Some(philly::Window::philly_640()),
    )?;
    let nodes = (1..=80)
        .map(|i| NodeSpec::new(format!("node-{i}"), 8, "philly-gpu"))
        .collect();
    // Proportional to node counts: the VCs' own 8 GPUs per node (2,816 in all) scaled to the
    // pool's 640 only changes the unit, not the shares.
    let nominal = trace
        .teams
        .iter()
        .map(|t| (t.name.clone(), t.nominal_gpus))
        .collect();
    Ok(Scenario {
        name: "philly-640".into(),
        trace,
        nodes,
        nominal,
        dag: None,
    })
}

/// `pipelines`: synthetic preprocess → train → evaluate pipelines ([`pipelines::generate`])
/// with durations drawn from all the Philly jobs of the VCs in `vc_nodes.csv`, on `nodes`;
/// every team has the same nominal quota. Fails if the parameters are impossible or a stage
/// could never be placed on `nodes`.
pub fn pipelines(
    traces: &Path,
    params: &Params,
    nodes: Vec<NodeSpec>,
) -> Result<Scenario, PipelineError> {
    let problems = params.problems();
    if !problems.is_empty() {
        return Err(PipelineError::Params(problems));
    }
    params.check_fits(&nodes)?;
    let dir = traces.join("philly");
    let source = philly::load(&dir.join("jobs.csv"), &dir.join("vc_nodes.csv"), None)?;
    let generated = pipelines::generate(&source, params)?;
    let nominal = generated
        .trace
        .teams
        .iter()
        .map(|t| (t.name.clone(), t.nominal_gpus))
        .collect();
    Ok(Scenario {
        name: PIPELINES.into(),
        trace: generated.trace,
        nodes,
        nominal,
        dag: Some(generated.dag),
    })
}

/// The name of the synthetic pipelines scenario, which takes parameters ([`pipelines`]).
pub const PIPELINES: &str = "pipelines";

/// The scenarios known by name.
pub const NAMES: &[&str] = &["philly-640"];

/// Loads a scenario by name from the traces folder.
pub fn by_name(name: &str, traces: &Path) -> Option<Result<Scenario, LoadError>> {
    match name {
        "philly-640" => Some(philly_640(traces)),
        _ => None,
    }
}

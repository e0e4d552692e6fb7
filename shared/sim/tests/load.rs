//! The trace loaders: on the real traces in `../shared/traces` (skipped with a message when the
//! folder is absent), and on small files written for each case.

use std::path::{Path, PathBuf};

use allot_sim::load::{generic, openb, philly, tiresias};
use allot_sim::{LoadError, Trace, TraceJob, TraceNode, TraceTeam};
use chrono::NaiveDate;
use tempfile::TempDir;

// ---------------------------------------------------------------------------------------------
// Helpers

/// The real traces, or `None` (after saying so) when this checkout does not have them.
fn real_traces(test: &str) -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "skipping {test}: the real traces are not at {} (see shared/traces/README.md)",
            dir.display()
        );
        None
    }
}

/// A temporary folder holding the given files.
fn folder(files: &[(&str, &str)]) -> TempDir {
    let dir = TempDir::new().expect("a temporary folder");
    for (name, contents) in files {
        std::fs::write(dir.path().join(name), contents).expect("a written fixture");
    }
    dir
}

/// The files each loader reads from a folder made by [`folder`].
fn load_philly(dir: &Path) -> Result<Trace, LoadError> {
    philly::load(&dir.join("jobs.csv"), &dir.join("vc_nodes.csv"), None)
}

fn load_philly_640(dir: &Path) -> Result<Trace, LoadError> {
    philly::load(
        &dir.join("jobs.csv"),
        &dir.join("vc_nodes.csv"),
        Some(philly::Window::philly_640()),
    )
}

fn load_philly_reversed_window(dir: &Path) -> Result<Trace, LoadError> {
    let philly_640 = philly::Window::philly_640();
    let reversed = philly::Window {
        from: philly_640.to,
        to: philly_640.from,
    };
    philly::load(
        &dir.join("jobs.csv"),
        &dir.join("vc_nodes.csv"),
        Some(reversed),
    )
}

fn load_openb(dir: &Path) -> Result<Trace, LoadError> {
    openb::load(&dir.join("pods.csv"), &dir.join("nodes.csv"))
}

fn load_tiresias(dir: &Path) -> Result<Trace, LoadError> {
    tiresias::load(&dir.join("jobs.csv"), &dir.join("cluster_spec.csv"))
}

fn load_generic(dir: &Path) -> Result<Trace, LoadError> {
    generic::load(&dir.join("trace.csv"))
}

const VC_NODES: &str = "vc,node num\nvc-a,2\nvc-b,1\n";
const PODS_HEADER: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,\
                           creation_time,deletion_time,scheduled_time\n";
const OPENB_NODES: &str = "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,262144,0,\n";
const CLUSTER_SPEC: &str =
    "num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node\n2,3,4,40,256\n";

fn names(trace: &Trace) -> Vec<&str> {
    trace.jobs.iter().map(|job| job.name.as_str()).collect()
}

// ---------------------------------------------------------------------------------------------
// The real traces

#[test]
fn philly_640_loads_the_reference_scenario_jobs_and_teams() {
    let Some(traces) = real_traces("philly_640_loads_the_reference_scenario_jobs_and_teams") else {
        return;
    };
    let window = philly::Window::philly_640();
    let trace = philly::load(
        &traces.join("philly/jobs.csv"),
        &traces.join("philly/vc_nodes.csv"),
        Some(window),
    )
    .expect("the Philly trace loads");

    assert_eq!(trace.jobs.len(), 68_503, "jobs in the philly-640 window");
    let multi_node = trace.jobs.iter().filter(|job| job.gpus > 8).count();
    assert_eq!(multi_node, 186, "jobs wider than one node");
    assert_eq!(trace.jobs.iter().map(|job| job.gpus).max(), Some(32));
    assert_eq!(trace.teams.len(), 11);
    let nominal: u32 = trace.teams.iter().map(|team| team.nominal_gpus).sum();
    assert_eq!(nominal, 352 * 8, "nominal GPUs of the 11 VCs");
    assert!(
        trace.nodes.is_empty(),
        "the scenario, not the trace, defines the cluster"
    );
    assert_eq!(
        trace.teams.first(),
        Some(&TraceTeam {
            name: "6214e9".into(),
            nominal_gpus: 64 * 8
        }),
        "teams keep vc_nodes.csv order"
    );

    let span_ms = u64::try_from((window.to - window.from).num_milliseconds()).unwrap();
    assert!(trace.jobs.iter().all(|job| job.submit <= span_ms));
    assert!(
        trace
            .jobs
            .windows(2)
            .all(|pair| (pair[0].submit, pair[0].id) < (pair[1].submit, pair[1].id)),
        "jobs sorted by (submit, id)"
    );
    let mut ids: Vec<u32> = trace.jobs.iter().map(|job| job.id).collect();
    ids.sort_unstable();
    assert!(
        ids.iter().copied().eq(0..68_503),
        "ids number the loaded jobs"
    );
    assert!(
        trace
            .jobs
            .iter()
            .all(|job| job.gpu_milli == 1000 && job.gpus >= 1)
    );
    assert!(
        trace
            .jobs
            .iter()
            .all(|job| trace.teams.iter().any(|team| team.name == job.team))
    );
}

#[test]
fn philly_without_a_window_counts_from_the_earliest_job_of_a_listed_vc() {
    let Some(traces) =
        real_traces("philly_without_a_window_counts_from_the_earliest_job_of_a_listed_vc")
    else {
        return;
    };
    let all = philly::load(
        &traces.join("philly/jobs.csv"),
        &traces.join("philly/vc_nodes.csv"),
        None,
    )
    .expect("the Philly trace loads");
    assert!(
        all.jobs.len() > 68_503,
        "the whole trace holds more than the window"
    );
    assert_eq!(all.jobs.first().map(|job| job.submit), Some(0));
}

#[test]
fn openb_loads_every_pod_and_both_node_lists() {
    let Some(traces) = real_traces("openb_loads_every_pod_and_both_node_lists") else {
        return;
    };
    let pods = traces.join("openb/pods.csv");
    let trace = openb::load(&pods, &traces.join("openb/nodes.csv")).expect("openb loads");
    assert_eq!(trace.jobs.len(), 8_152, "pods");
    assert_eq!(trace.nodes.len(), 1_213, "GPU nodes");
    assert_eq!(
        trace.nodes.iter().map(|node| node.gpus).sum::<u32>(),
        6_212,
        "GPUs"
    );
    let cpu_only_pods = trace.jobs.iter().filter(|job| job.gpus == 0).count();
    assert_eq!(cpu_only_pods, 1_088);
    let fractional = trace
        .jobs
        .iter()
        .filter(|job| job.gpu_milli < 1000 && job.gpus == 1);
    assert_eq!(fractional.count(), 3_078, "GPU-sharing pods");
    assert!(
        trace
            .jobs
            .iter()
            .all(|job| job.gpus == 0 || (1..=1000).contains(&job.gpu_milli))
    );

    let all = openb::load(&pods, &traces.join("openb/nodes_all.csv")).expect("openb loads");
    assert_eq!(all.nodes.len(), 1_523, "the whole cluster");
    let cpu_only_nodes = all
        .nodes
        .iter()
        .filter(|node| node.model.is_empty())
        .count();
    assert_eq!(cpu_only_nodes, 310);
}

#[test]
fn tiresias_loads_the_sixty_job_sample_and_its_cluster() {
    let Some(traces) = real_traces("tiresias_loads_the_sixty_job_sample_and_its_cluster") else {
        return;
    };
    let trace = tiresias::load(
        &traces.join("tiresias/60_job.csv"),
        &traces.join("tiresias/cluster_spec.csv"),
    )
    .expect("the Tiresias sample loads");
    assert_eq!(trace.jobs.len(), 60);
    assert_eq!(trace.nodes.len(), 16);
    assert!(trace.nodes.iter().all(|node| node.gpus == 4));
    let first = &trace.jobs[0];
    assert_eq!(
        (first.name.as_str(), first.submit, first.duration),
        ("job-0", 0, 164_000)
    );
}

// ---------------------------------------------------------------------------------------------
// Malformed files

#[test]
fn malformed_files_name_file_line_and_column() {
    struct Case {
        name: &'static str,
        files: &'static [(&'static str, &'static str)],
        load: fn(&Path) -> Result<Trace, LoadError>,
        want_file: &'static str,
        want_line: Option<u64>,
        want_column: Option<&'static str>,
        want_message: &'static str,
    }
    let cases = [
        Case {
            name: "philly: a duration that is not a number",
            files: &[
                ("vc_nodes.csv", VC_NODES),
                (
                    "jobs.csv",
                    "timestamp,duration,num_gpus,gpu_time,cluster\n\
                     2017-10-01 00:00:00,66.0,1,66.0,vc-a\n\
                     2017-10-01 00:00:01,soon,1,66.0,vc-a\n",
                ),
            ],
            load: load_philly,
            want_file: "jobs.csv",
            want_line: Some(3),
            want_column: Some("duration"),
            want_message: "expected seconds, found `soon`",
        },
        Case {
            name: "philly: a malformed row is an error even outside the window",
            files: &[
                ("vc_nodes.csv", VC_NODES),
                (
                    "jobs.csv",
                    "timestamp,duration,num_gpus,gpu_time,cluster\n\
                     2017-09-01 00:00:00,66.0,one,66.0,vc-a\n",
                ),
            ],
            load: load_philly_640,
            want_file: "jobs.csv",
            want_line: Some(2),
            want_column: Some("num_gpus"),
            want_message: "expected a whole number of GPUs, found `one`",
        },
        Case {
            name: "philly: a timestamp that is not a calendar time",
            files: &[
                ("vc_nodes.csv", VC_NODES),
                (
                    "jobs.csv",
                    "timestamp,duration,num_gpus,gpu_time,cluster\n\
                     2017-10-32 00:00:00,66.0,1,66.0,vc-a\n",
                ),
            ],
            load: load_philly,
            want_file: "jobs.csv",
            want_line: Some(2),
            want_column: Some("timestamp"),
            want_message: "found `2017-10-32 00:00:00`",
        },
        Case {
            name: "philly: a timestamp in another format",
            files: &[
                ("vc_nodes.csv", VC_NODES),
                (
                    "jobs.csv",
                    "timestamp,duration,num_gpus,gpu_time,cluster\n\
                     2017-10-01T00:00:00Z,66.0,1,66.0,vc-a\n",
                ),
            ],
            load: load_philly,
            want_file: "jobs.csv",
            want_line: Some(2),
            want_column: Some("timestamp"),
            want_message: "expected a UTC time like `2017-10-01 00:00:00`",
        },
        Case {
            name: "philly: a negative duration",
            files: &[
                ("vc_nodes.csv", VC_NODES),
                (
                    "jobs.csv",
                    "timestamp,duration,num_gpus,gpu_time,cluster\n\
                     2017-10-01 00:00:00,-66.0,1,66.0,vc-a\n",
                ),
            ],
            load: load_philly,
            want_file: "jobs.csv",
            want_line: Some(2),
            want_column: Some("duration"),
            want_message: "negative",
        },
        Case {
            name: "philly: jobs.csv without num_gpus",
            files: &[
                ("vc_nodes.csv", VC_NODES),
                (
                    "jobs.csv",
                    "timestamp,duration,cluster\n2017-10-01 00:00:00,66.0,vc-a\n",
                ),
            ],
            load: load_philly,
            want_file: "jobs.csv",
            want_line: Some(1),
            want_column: Some("num_gpus"),
            want_message: "missing required column",
        },
        Case {
            name: "philly: vc_nodes.csv without its node counts",
            files: &[
                ("vc_nodes.csv", "vc,nodes\nvc-a,2\n"),
                ("jobs.csv", "timestamp,duration,num_gpus,cluster\n"),
            ],
            load: load_philly,
            want_file: "vc_nodes.csv",
            want_line: Some(1),
            want_column: Some("node num"),
            want_message: "missing required column",
        },
        Case {
            name: "philly: a window that ends before it starts",
            files: &[
                ("vc_nodes.csv", VC_NODES),
                ("jobs.csv", "timestamp,duration,num_gpus,cluster\n"),
            ],
            load: load_philly_reversed_window,
            want_file: "jobs.csv",
            want_line: None,
            want_column: None,
            want_message: "the window ends (2017-10-01 00:00:00) before it starts",
        },
        Case {
            name: "philly: a VC listed twice",
            files: &[
                ("vc_nodes.csv", "vc,node num\nvc-a,2\nvc-a,3\n"),
                ("jobs.csv", "timestamp,duration,num_gpus,cluster\n"),
            ],
            load: load_philly,
            want_file: "vc_nodes.csv",
            want_line: Some(3),
            want_column: Some("vc"),
            want_message: "listed twice",
        },
        Case {
            name: "philly: a row with a field too few",
            files: &[
                ("vc_nodes.csv", VC_NODES),
                (
                    "jobs.csv",
                    "timestamp,duration,num_gpus,gpu_time,cluster\n\
                     2017-10-01 00:00:00,66.0,1,vc-a\n",
                ),
            ],
            load: load_philly,
            want_file: "jobs.csv",
            want_line: Some(2),
            want_column: None,
            want_message: "4 fields where the header has 5",
        },
        Case {
            name: "line numbers count the blank lines before the bad row",
            files: &[
                ("vc_nodes.csv", VC_NODES),
                (
                    "jobs.csv",
                    "timestamp,duration,num_gpus,gpu_time,cluster\n\
                     \n\
                     2017-10-01 00:00:00,66.0,1,66.0,vc-a\n\
                     \x20\x20\n\
                     \n\
                     2017-10-01 00:00:00,66.0,1,66.0,\n",
                ),
            ],
            load: load_philly,
            want_file: "jobs.csv",
            want_line: Some(6),
            want_column: Some("cluster"),
            want_message: "empty field",
        },
        Case {
            name: "line numbers hold with CRLF line ends and blank lines",
            files: &[(
                "trace.csv",
                "submit_time,duration,num_gpus\r\n\r\n0,1,1\r\n\r\n\r\n0,1,x\r\n",
            )],
            load: load_generic,
            want_file: "trace.csv",
            want_line: Some(6),
            want_column: Some("num_gpus"),
            want_message: "expected a whole number of GPUs, found `x`",
        },
        Case {
            name: "line numbers count the lines inside a quoted field",
            files: &[(
                "trace.csv",
                "submit_time,duration,num_gpus,team\n0,1,1,\"two\nlines\"\n0,1,-1,a\n",
            )],
            load: load_generic,
            want_file: "trace.csv",
            want_line: Some(4),
            want_column: Some("num_gpus"),
            want_message: "found `-1`",
        },
        Case {
            name: "openb: a creation time that is not a number",
            files: &[
                ("nodes.csv", OPENB_NODES),
                (
                    "pods.csv",
                    concat!(
                        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,",
                        "creation_time,deletion_time,scheduled_time\n",
                        "p0,1000,1024,1,1000,,LS,Running,yesterday,10,0\n",
                    ),
                ),
            ],
            load: load_openb,
            want_file: "pods.csv",
            want_line: Some(2),
            want_column: Some("creation_time"),
            want_message: "expected seconds, found `yesterday`",
        },
        Case {
            name: "openb: a QoS class the trace does not use",
            files: &[
                ("nodes.csv", OPENB_NODES),
                (
                    "pods.csv",
                    concat!(
                        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,",
                        "creation_time,deletion_time,scheduled_time\n",
                        "p0,1000,1024,1,1000,,Premium,Running,0,10,0\n",
                    ),
                ),
            ],
            load: load_openb,
            want_file: "pods.csv",
            want_line: Some(2),
            want_column: Some("qos"),
            want_message: "unknown QoS `Premium`",
        },
        Case {
            name: "openb: a minimal pod list without its GPU share",
            files: &[
                ("nodes.csv", OPENB_NODES),
                (
                    "pods.csv",
                    "name,cpu_milli,memory_mib,num_gpu\np0,1000,1024,1\n",
                ),
            ],
            load: load_openb,
            want_file: "pods.csv",
            want_line: Some(1),
            want_column: Some("gpu_milli"),
            want_message: "missing required column",
        },
        Case {
            name: "openb: a node list without models",
            files: &[
                ("nodes.csv", "sn,cpu_milli,memory_mib,gpu\nn0,1000,1024,8\n"),
                ("pods.csv", PODS_HEADER),
            ],
            load: load_openb,
            want_file: "nodes.csv",
            want_line: Some(1),
            want_column: Some("model"),
            want_message: "missing required column",
        },
        Case {
            name: "tiresias: a duration that is not a number",
            files: &[
                ("cluster_spec.csv", CLUSTER_SPEC),
                (
                    "jobs.csv",
                    "job_id,num_gpu,submit_time,duration\n0,1,0,1h\n",
                ),
            ],
            load: load_tiresias,
            want_file: "jobs.csv",
            want_line: Some(2),
            want_column: Some("duration"),
            want_message: "expected seconds, found `1h`",
        },
        Case {
            name: "tiresias: a negative submit time",
            files: &[
                ("cluster_spec.csv", CLUSTER_SPEC),
                (
                    "jobs.csv",
                    "job_id,num_gpu,submit_time,duration\n0,1,-5,10\n",
                ),
            ],
            load: load_tiresias,
            want_file: "jobs.csv",
            want_line: Some(2),
            want_column: Some("submit_time"),
            want_message: "negative",
        },
        Case {
            name: "tiresias: a cluster spec of two rows",
            files: &[
                (
                    "cluster_spec.csv",
                    concat!(
                        "num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node\n",
                        "1,16,4,128,254\n1,32,4,40,256\n",
                    ),
                ),
                ("jobs.csv", "job_id,num_gpu,submit_time,duration\n"),
            ],
            load: load_tiresias,
            want_file: "cluster_spec.csv",
            want_line: Some(3),
            want_column: None,
            want_message: "more than one row",
        },
        Case {
            name: "generic: a duration that is not a number",
            files: &[("trace.csv", "submit_time,duration,num_gpus\n0,ten,1\n")],
            load: load_generic,
            want_file: "trace.csv",
            want_line: Some(2),
            want_column: Some("duration"),
            want_message: "expected seconds, found `ten`",
        },
        Case {
            name: "generic: a duration of NaN",
            files: &[("trace.csv", "submit_time,duration,num_gpus\n0,NaN,1\n")],
            load: load_generic,
            want_file: "trace.csv",
            want_line: Some(2),
            want_column: Some("duration"),
            want_message: "NaN",
        },
        Case {
            name: "generic: a negative duration",
            files: &[("trace.csv", "submit_time,duration,num_gpus\n0,-1.5,1\n")],
            load: load_generic,
            want_file: "trace.csv",
            want_line: Some(2),
            want_column: Some("duration"),
            want_message: "negative",
        },
        Case {
            name: "generic: no num_gpus column",
            files: &[("trace.csv", "submit_time,duration\n0,10\n")],
            load: load_generic,
            want_file: "trace.csv",
            want_line: Some(1),
            want_column: Some("num_gpus"),
            want_message: "missing required column",
        },
        Case {
            name: "generic: a misspelt optional column",
            files: &[(
                "trace.csv",
                "submit_time,duration,num_gpus,gpu_mili\n0,10,1,500\n",
            )],
            load: load_generic,
            want_file: "trace.csv",
            want_line: Some(1),
            want_column: Some("gpu_mili"),
            want_message: "unknown column `gpu_mili`",
        },
        Case {
            name: "generic: more than a whole GPU in gpu_milli",
            files: &[(
                "trace.csv",
                "submit_time,duration,num_gpus,gpu_milli\n0,10,1,1500\n",
            )],
            load: load_generic,
            want_file: "trace.csv",
            want_line: Some(2),
            want_column: Some("gpu_milli"),
            want_message: "1500 is not a share of a GPU",
        },
        Case {
            name: "generic: a zero share of a GPU",
            files: &[(
                "trace.csv",
                "submit_time,duration,num_gpus,gpu_milli\n0,10,1,0\n",
            )],
            load: load_generic,
            want_file: "trace.csv",
            want_line: Some(2),
            want_column: Some("gpu_milli"),
            want_message: "0 is not a share of a GPU",
        },
        Case {
            name: "generic: a fraction of a GPU on a multi-GPU job",
            files: &[(
                "trace.csv",
                "submit_time,duration,num_gpus,gpu_milli\n0,10,2,500\n",
            )],
            load: load_generic,
            want_file: "trace.csv",
            want_line: Some(2),
            want_column: Some("gpu_milli"),
            want_message: "needs num_gpus = 1, not 2",
        },
        Case {
            name: "generic: a column named twice",
            files: &[(
                "trace.csv",
                "submit_time,duration,num_gpus,team,team\n0,10,1,a,b\n",
            )],
            load: load_generic,
            want_file: "trace.csv",
            want_line: Some(1),
            want_column: Some("team"),
            want_message: "twice",
        },
        Case {
            name: "generic: a file that does not exist",
            files: &[],
            load: load_generic,
            want_file: "trace.csv",
            want_line: None,
            want_column: None,
            want_message: "cannot read",
        },
    ];

    for case in cases {
        let dir = folder(case.files);
        let err = match (case.load)(dir.path()) {
            Ok(trace) => panic!(
                "{}: loaded {} jobs, want an error",
                case.name,
                trace.jobs.len()
            ),
            Err(err) => err,
        };
        assert_eq!(
            err.file,
            dir.path().join(case.want_file),
            "{}: file",
            case.name
        );
        assert_eq!(err.line, case.want_line, "{}: line ({err})", case.name);
        assert_eq!(
            err.column.as_deref(),
            case.want_column,
            "{}: column ({err})",
            case.name
        );
        assert!(
            err.message.contains(case.want_message),
            "{}: message {:?} lacks {:?}",
            case.name,
            err.message,
            case.want_message
        );
    }
}

#[test]
fn a_load_error_reads_as_file_line_column_message() {
    let dir = folder(&[("trace.csv", "submit_time,duration,num_gpus\n0,ten,1\n")]);
    let err = load_generic(dir.path()).unwrap_err();
    let file = dir.path().join("trace.csv");
    assert_eq!(
        err.to_string(),
        format!(
            "{}:2: column `duration`: expected seconds, found `ten`",
            file.display()
        )
    );
}

// ---------------------------------------------------------------------------------------------
// What the loaders make of well-formed files

#[test]
fn philly_keeps_listed_vcs_within_the_window_and_counts_from_its_start() {
    let dir = folder(&[
        ("vc_nodes.csv", VC_NODES),
        (
            "jobs.csv",
            // Column order differs from the real file, and the file ends with a blank line.
            "cluster,num_gpus,duration,timestamp,gpu_time\n\
             vc-a,1,66.0,2017-09-30 23:59:59,66.0\n\
             vc-a,8,10.5,2017-10-01 00:00:00,84.0\n\
             vc-unknown,1,5.0,2017-10-01 00:00:01,5.0\n\
             vc-b,16,1.0,2017-10-01 00:00:01,16.0\n\
             vc-a,2,2.0,2017-11-30 23:59:59,4.0\n\
             vc-b,1,3.0,2017-12-01 00:00:00,3.0\n\
             \n",
        ),
    ]);
    let trace = load_philly_640(dir.path()).expect("loads");

    let job = |id, name: &str, submit, duration, gpus, team: &str| TraceJob {
        id,
        name: name.into(),
        submit,
        duration,
        gpus,
        gpu_milli: 1000,
        gpu_models: vec![],
        team: team.into(),
        priority: 0,
        cpu_milli: 0,
        memory_mib: 0,
        deadline: None,
    };
    let last_second = (60 * 24 * 3600 + 23 * 3600 + 59 * 60 + 59) * 1000;
    assert_eq!(
        trace.jobs,
        vec![
            job(0, "jobs.csv:3", 0, 10_500, 8, "vc-a"),
            job(1, "jobs.csv:5", 1_000, 1_000, 16, "vc-b"),
            job(2, "jobs.csv:6", last_second, 2_000, 2, "vc-a"),
        ],
        "both ends of the window are in; other VCs and other times are out"
    );
    assert_eq!(
        trace.teams,
        vec![
            TraceTeam {
                name: "vc-a".into(),
                nominal_gpus: 16
            },
            TraceTeam {
                name: "vc-b".into(),
                nominal_gpus: 8
            },
        ]
    );
    assert!(trace.source.starts_with("philly:"));
}

#[test]
fn philly_without_a_window_keeps_every_time_and_counts_from_the_earliest_kept_job() {
    let dir = folder(&[
        ("vc_nodes.csv", VC_NODES),
        (
            "jobs.csv",
            "timestamp,duration,num_gpus,gpu_time,cluster\n\
             2017-10-01 00:00:10,1.0,1,1.0,vc-a\n\
             2017-10-01 00:00:00,1.0,1,1.0,vc-unknown\n\
             2017-10-01 00:00:05,1.0,1,1.0,vc-b\n",
        ),
    ]);
    let trace = load_philly(dir.path()).expect("loads");
    let got: Vec<(&str, u64)> = trace
        .jobs
        .iter()
        .map(|job| (job.name.as_str(), job.submit))
        .collect();
    assert_eq!(got, [("jobs.csv:4", 0), ("jobs.csv:2", 5_000)]);
}

#[test]
fn equal_submit_times_keep_file_order_in_every_loader() {
    struct Case {
        name: &'static str,
        files: &'static [(&'static str, &'static str)],
        load: fn(&Path) -> Result<Trace, LoadError>,
        want_names: &'static [&'static str],
    }
    let cases = [
        Case {
            name: "philly",
            files: &[
                ("vc_nodes.csv", VC_NODES),
                (
                    "jobs.csv",
                    "timestamp,duration,num_gpus,gpu_time,cluster\n\
                     2017-10-01 00:00:05,1.0,1,1.0,vc-a\n\
                     2017-10-01 00:00:00,1.0,1,1.0,vc-b\n\
                     2017-10-01 00:00:05,1.0,1,1.0,vc-b\n\
                     2017-10-01 00:00:00,1.0,1,1.0,vc-a\n",
                ),
            ],
            load: load_philly,
            want_names: &["jobs.csv:3", "jobs.csv:5", "jobs.csv:2", "jobs.csv:4"],
        },
        Case {
            name: "openb",
            files: &[
                ("nodes.csv", OPENB_NODES),
                (
                    "pods.csv",
                    concat!(
                        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,",
                        "creation_time,deletion_time,scheduled_time\n",
                        "p-a,0,0,1,1000,,LS,Running,5,,\n",
                        "p-b,0,0,1,1000,,LS,Running,0,,\n",
                        "p-c,0,0,1,1000,,LS,Running,5,,\n",
                        "p-d,0,0,1,1000,,LS,Running,0,,\n",
                    ),
                ),
            ],
            load: load_openb,
            want_names: &["p-b", "p-d", "p-a", "p-c"],
        },
        Case {
            name: "tiresias",
            files: &[
                ("cluster_spec.csv", CLUSTER_SPEC),
                (
                    "jobs.csv",
                    "job_id,num_gpu,submit_time,duration\n7,1,5,1\n3,1,0,1\n9,1,5,1\n1,1,0,1\n",
                ),
            ],
            load: load_tiresias,
            want_names: &["job-3", "job-1", "job-7", "job-9"],
        },
        Case {
            name: "generic",
            files: &[(
                "trace.csv",
                "submit_time,duration,num_gpus\n5,1,1\n0,1,1\n5,1,1\n0.0,1,1\n",
            )],
            load: load_generic,
            want_names: &["trace.csv:3", "trace.csv:5", "trace.csv:2", "trace.csv:4"],
        },
    ];
    for case in cases {
        let dir = folder(case.files);
        let trace = (case.load)(dir.path()).unwrap_or_else(|err| panic!("{}: {err}", case.name));
        assert_eq!(names(&trace), case.want_names, "{}", case.name);
        let ids: Vec<u32> = trace.jobs.iter().map(|job| job.id).collect();
        assert_eq!(ids, [1, 3, 0, 2], "{}: ids are file positions", case.name);
    }
}

#[test]
fn openb_pods_become_jobs_with_fractions_models_priorities_and_run_times() {
    let dir = folder(&[
        (
            "nodes.csv",
            "model,sn,gpu,cpu_milli,memory_mib\n\
             nan,cpu-node,0,32000,262144\n\
             ,cpu-node-2,0,32000,262144\n\
             V100M32,gpu-node,8,96000,786432\n",
        ),
        (
            "pods.csv",
            concat!(
                "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,",
                "creation_time,deletion_time,scheduled_time\n",
                "frac,6000,12288,1,460,,LS,Running,10,100,20\n",
                "whole,88000,327680,8,1000,nan,Burstable,Succeeded,11,50,11\n",
                "models,16000,32768,1,1000,V100M16|V100M32,Guaranteed,Running,12,12,13\n",
                "cpu,4000,8192,0,0,,BE,Running,13,20,\n",
                "pending,4000,15258,1,220,,BE,Pending,14,,\n",
            ),
        ),
    ]);
    let trace = load_openb(dir.path()).expect("loads");

    // (name, submit, duration, gpus, gpu_milli, gpu_models, priority, cpu_milli, memory_mib)
    let got: Vec<_> = trace
        .jobs
        .iter()
        .map(|job| {
            (
                job.name.as_str(),
                job.submit,
                job.duration,
                job.gpus,
                job.gpu_milli,
                job.gpu_models.join("|"),
                job.priority,
                job.cpu_milli,
                job.memory_mib,
            )
        })
        .collect();
    let want = [
        (
            "frac",
            10_000,
            80_000,
            1,
            460,
            String::new(),
            1,
            6000,
            12288,
        ),
        (
            "whole",
            11_000,
            39_000,
            8,
            1000,
            String::new(),
            1,
            88000,
            327680,
        ),
        (
            "models",
            12_000,
            0,
            1,
            1000,
            "V100M16|V100M32".to_owned(),
            1,
            16000,
            32768,
        ),
        ("cpu", 13_000, 0, 0, 0, String::new(), 0, 4000, 8192),
        ("pending", 14_000, 0, 1, 220, String::new(), 0, 4000, 15258),
    ];
    assert_eq!(got, want);
    assert!(trace.jobs.iter().all(|job| job.team == "default"));

    let node = |name: &str, gpus, model: &str, cpu_milli, memory_mib| TraceNode {
        name: name.into(),
        gpus,
        model: model.into(),
        cpu_milli,
        memory_mib,
    };
    assert_eq!(
        trace.nodes,
        vec![
            node("cpu-node", 0, "", 32000, 262144),
            node("cpu-node-2", 0, "", 32000, 262144),
            node("gpu-node", 8, "V100M32", 96000, 786432),
        ]
    );
}

#[test]
fn openb_pods_with_only_fgds_minimal_columns_load_unconstrained() {
    // FGD's published pod lists: no models, QoS or times. Every pod may go on any model,
    // arrives at 0 in file order, never departs, and none is best effort.
    let dir = folder(&[
        (
            "nodes.csv",
            "sn,cpu_milli,memory_mib,gpu,model\nn0,96000,786432,8,V100M32\n",
        ),
        (
            "pods.csv",
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n\
             frac,6000,12288,1,460\n\
             whole,88000,327680,8,1000\n\
             cpu,4000,8192,0,0\n",
        ),
    ]);
    let trace = load_openb(dir.path()).expect("a minimal pod list loads");

    // (name, submit, duration, gpus, gpu_milli, gpu_models, priority, cpu_milli, memory_mib)
    let got: Vec<_> = trace
        .jobs
        .iter()
        .map(|job| {
            (
                job.name.as_str(),
                job.submit,
                job.duration,
                job.gpus,
                job.gpu_milli,
                job.gpu_models.len(),
                job.priority,
                job.cpu_milli,
                job.memory_mib,
            )
        })
        .collect();
    let want = [
        ("frac", 0, 0, 1, 460, 0, 1, 6000, 12288),
        ("whole", 0, 0, 8, 1000, 0, 1, 88000, 327680),
        ("cpu", 0, 0, 0, 0, 0, 1, 4000, 8192),
    ];
    assert_eq!(got, want);
}

#[test]
fn tiresias_cluster_spec_becomes_named_identical_nodes() {
    let dir = folder(&[
        ("cluster_spec.csv", CLUSTER_SPEC),
        (
            "jobs.csv",
            "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n\
             4,2,30,133,vgg11,147,23\n",
        ),
    ]);
    let trace = load_tiresias(dir.path()).expect("loads");
    let names: Vec<&str> = trace.nodes.iter().map(|node| node.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "switch0-node0",
            "switch0-node1",
            "switch0-node2",
            "switch1-node0",
            "switch1-node1",
            "switch1-node2"
        ]
    );
    assert!(trace.nodes.iter().all(|node| node.gpus == 4
        && node.model.is_empty()
        && node.cpu_milli == 40_000
        && node.memory_mib == 256 * 1024));
    let job = &trace.jobs[0];
    assert_eq!(
        (
            job.name.as_str(),
            job.submit,
            job.duration,
            job.gpus,
            job.gpu_milli
        ),
        ("job-4", 30_000, 147_000, 2, 1000)
    );
}

#[test]
fn generic_fills_defaults_and_reads_optional_columns_in_any_order() {
    let dir = folder(&[(
        "trace.csv",
        "gpu_model,num_gpus,duration,submit_time,team,gpu_milli,priority,cpu_milli,memory_mib\n\
         ,1,10,0,,,,,\n\
         A10|T4,1,0.5,1.25,research,250,-1,2000,4096\n\
         H100,4,3600,2,prod,1000,5,,\n\
         ,0,1,3,,1000,,,\n",
    )]);
    let trace = load_generic(dir.path()).expect("loads");
    // (submit, duration, gpus, gpu_milli, gpu_models, team, priority, cpu_milli, memory_mib)
    let got: Vec<_> = trace
        .jobs
        .iter()
        .map(|job| {
            (
                job.submit,
                job.duration,
                job.gpus,
                job.gpu_milli,
                job.gpu_models.join("|"),
                job.team.as_str(),
                job.priority,
                job.cpu_milli,
                job.memory_mib,
            )
        })
        .collect();
    let want = [
        (0, 10_000, 1, 1000, "", "default", 0, 0, 0),
        (1_250, 500, 1, 250, "A10|T4", "research", -1, 2000, 4096),
        (2_000, 3_600_000, 4, 1000, "H100", "prod", 5, 0, 0),
        (3_000, 1_000, 0, 0, "", "default", 0, 0, 0),
    ];
    assert_eq!(
        got,
        want.map(|w| (w.0, w.1, w.2, w.3, w.4.to_owned(), w.5, w.6, w.7, w.8))
    );
    assert!(trace.nodes.is_empty() && trace.teams.is_empty());
}

#[test]
fn philly_640_window_is_october_and_november_2017() {
    let window = philly::Window::philly_640();
    let at = |m, d, h, mi, s| {
        NaiveDate::from_ymd_opt(2017, m, d)
            .unwrap()
            .and_hms_opt(h, mi, s)
            .unwrap()
    };
    assert_eq!(window.from, at(10, 1, 0, 0, 0));
    assert_eq!(window.to, at(11, 30, 23, 59, 59));
}

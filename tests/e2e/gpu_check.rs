//! `scripts/gpu-check.sh`, the check a platform team runs on a GPU node (docs/real-gpu.md), run
//! here on the simulated GPU source so that it keeps working where there is no GPU: the services
//! start, the pipeline's three GPU tasks are granted — two halves of one GPU side by side, then
//! the whole GPU — and the summary shows what held the GPU and what it cost.

use std::path::Path;
use std::process::Command;

#[test]
fn the_gpu_check_script_runs_its_pipeline_and_records_what_held_the_gpu() {
    let Ok(nats) = allot_testkit::nats_server_binary() else {
        panic!("no nats-server: run scripts/install-nats.sh");
    };
    let out = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/gpu-check.sh");
    let run = Command::new("bash")
        .arg(script)
        .arg(out.path())
        .env("ALLOT", env!("CARGO_BIN_EXE_allot"))
        .env("NATS_SERVER", nats)
        .env("GPU_SOURCE", "sim")
        .env("LOAD_SECS", "3")
        .env_remove("ALLOT_NATS_URL")
        .env_remove("ALLOT_CREDENTIALS")
        .output()
        .unwrap();
    let summary = std::fs::read_to_string(out.path().join("summary.txt")).unwrap_or_default();
    assert!(
        run.status.success(),
        "{summary}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(summary.contains("== submit --follow (exit 0)"), "{summary}");
    assert!(summary.contains("succeeded after"), "{summary}");
    // Each GPU task saw its share of GPU 0.
    for (task, milli) in [("half-a", 500), ("half-b", 500), ("whole", 1000)] {
        assert!(
            summary.contains(&format!(
                "{task}'s output: CUDA_VISIBLE_DEVICES=0 milli={milli}"
            )),
            "{task}: {summary}"
        );
    }
    // The snapshot taken while the halves ran shows both holding GPU 0.
    let halves: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("status-halves.json")).unwrap(),
    )
    .unwrap();
    let held: Vec<&str> = halves["nodes"][0]["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["held_by"].as_array().unwrap())
        .filter_map(|h| h["task"].as_str())
        .collect();
    assert_eq!(held, ["half-a", "half-b"], "{halves}");
    assert!(summary.contains("platform/gpu-check-"), "a cost: {summary}");
}

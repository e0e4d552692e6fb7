//! `allot predict eval` on the real Philly trace (skipped with a message when
//! `../shared/traces` is absent): the report names every predictor with every metric, scores
//! every job after the split, and the shipped predictor's 10–90% interval covers about 80% of
//! them.

use std::path::Path;

use crate::support::allot;

#[test]
fn predict_eval_scores_the_predictor_and_the_baselines_after_the_split() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let traces = root.join("../shared/traces");
    if !traces.join("philly/jobs.csv").is_file() {
        eprintln!("skipped: {} is absent", traces.display());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("eval.json");
    let out = allot(dir.path())
        .args([
            "predict",
            "eval",
            "--trace",
            "philly",
            "--split",
            "2017-11-01",
        ])
        .arg("--traces")
        .arg(&traces)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(report["train_jobs"].as_u64().unwrap() > 40_000, "{report}");
    assert!(report["test_jobs"].as_u64().unwrap() > 20_000, "{report}");
    for name in [
        "allot",
        "global-median",
        "team-gpus-median",
        "team-gpus-last10",
    ] {
        let m = &report["predictors"][name];
        for metric in ["mdale", "within_2x", "p90_ale", "spearman"] {
            assert!(m[metric].is_f64(), "{name}.{metric}: {report}");
        }
        assert!(stdout.contains(name), "{stdout}");
    }
    let coverage = report["predictors"]["allot"]["coverage_p10_p90"]
        .as_f64()
        .unwrap();
    assert!((0.7..=0.9).contains(&coverage), "{coverage}");
    // The recency statistics it builds on beat the all-history ones, as the issue measured.
    let mdale = |name: &str| report["predictors"][name]["mdale"].as_f64().unwrap();
    assert!(mdale("allot") < mdale("team-gpus-median"), "{report}");
}

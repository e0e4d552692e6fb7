//! The examples a newcomer submits first must pass `allot validate` against the example teams
//! file and a cluster like `allot up`'s, and match the committed JSON Schema as JSON.

use std::path::{Path, PathBuf};

use allot_workload::{ClusterShape, Context, Format, TeamsConfig, check};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

#[test]
fn every_example_spec_is_valid_and_matches_the_committed_schema() {
    let teams =
        TeamsConfig::from_yaml(&std::fs::read_to_string(examples().join("teams.yaml")).unwrap())
            .unwrap();
    let mut cluster = ClusterShape::parse("4x8:H100").unwrap();
    cluster.nodes[0].gpu_memory_mib = 81_559;
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(examples().join("../schemas/workload.v1.json")).unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();

    let mut seen = 0;
    for entry in std::fs::read_dir(examples()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        // Workload specs; the teams file, the price table and the health rules are other
        // documents.
        let other = ["teams.yaml", "prices.yaml", "health-rules.yaml"];
        if !name.ends_with(".yaml") || other.contains(&name.as_str()) {
            continue;
        }
        seen += 1;
        let text = std::fs::read_to_string(&path).unwrap();
        let ctx = Context {
            teams: Some(&teams),
            cluster: Some(&cluster),
        };
        let checked = check(&text, Format::Yaml, ctx)
            .unwrap_or_else(|problems| panic!("{name}: {problems:#?}"));
        let as_json = serde_json::to_value(&checked.workload).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&as_json)
            .map(|e| format!("{e} at {}", e.instance_path))
            .collect();
        assert!(errors.is_empty(), "{name}: {errors:?}");
    }
    assert!(seen >= 2, "examples/ holds the specs");
}

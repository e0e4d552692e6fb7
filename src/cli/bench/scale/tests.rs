use std::time::Duration;

use super::{ScaleArgs, first_task, service_of, workload};

fn args() -> ScaleArgs {
    ScaleArgs {
        nodes: 4,
        workloads: 40,
        rate: 10.0,
        hold: Duration::from_secs(10),
        telemetry_interval: Duration::from_secs(1),
        pipeline_every: 10,
        warmup: 0,
        window: 16,
        services: Vec::new(),
        settle: Duration::from_secs(60),
        json: "scale.json".into(),
        journal: None,
    }
}

#[test]
fn workloads_are_valid_specs_with_pipelines_sizes_and_holds_spread() {
    let args = args();
    let mut pipelines = 0;
    let mut sizes = std::collections::BTreeSet::new();
    for i in 0..args.workloads {
        let (text, hold) = workload(i, &args);
        let checked = allot_workload::check(
            &text,
            allot_workload::Format::Yaml,
            allot_workload::Context::default(),
        )
        .unwrap_or_else(|p| panic!("workload {i} rejected: {p:?}\n{text}"));
        let tasks = &checked.workload.spec.tasks;
        assert!(first_task(&tasks[0].name), "{text}");
        if tasks.len() == 3 {
            pipelines += 1;
        }
        sizes.extend(
            tasks
                .iter()
                .filter_map(|t| Some(t.resources.gpus.as_ref()?.0.clone())),
        );
        assert!(
            (Duration::from_secs(5)..=Duration::from_secs(15)).contains(&hold),
            "workload {i} holds {hold:?}"
        );
    }
    assert_eq!(pipelines, 4, "every tenth workload is a pipeline");
    assert_eq!(sizes.len(), 4, "1, 2, 4 and 8 GPUs: {sizes:?}");
}

#[test]
fn a_durable_consumer_is_counted_against_the_service_its_name_starts_with() {
    let services = vec![("planner".to_owned(), 1), ("billing".to_owned(), 2)];
    assert_eq!(
        service_of("WORKLOADS/planner-workloads", &services),
        "planner"
    );
    assert_eq!(
        service_of("DECISIONS/billing-journal", &services),
        "billing"
    );
    assert_eq!(
        service_of("FLEET/inventory-fleet", &services),
        "inventory-fleet"
    );
}

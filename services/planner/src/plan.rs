//! From a submitted spec to the planner's state: validation again (a raw submission may come
//! from any NATS client), each task's [`TaskSpec`], and the ids of its attempts.

use uuid::Uuid;

use allot_events::task::RunSpec;
use allot_events::workload::WorkloadSubmitted;
use allot_sched::{Gang, TaskSpec, Time};
use allot_workload::quantity;
use allot_workload::{ClusterShape, Context, Format, TeamsConfig};

use crate::machine::{Task, TaskStatus, Workload, WorkloadStatus};

pub use allot_events::task::task_id;

/// The namespace of the planner's event ids (UUIDv5), which are also their `Nats-Msg-Id`s.
pub const EVENT_ID_NAMESPACE: Uuid = Uuid::from_u128(0x2c4e_81b3_95d0_4f6a_8e17_c03b_5a9d_e2f4);

/// The event id (and `Nats-Msg-Id`) of the planner's event named `key`
/// (`ready/<task id>/<attempt>`, `cancelled/<task id>/<lease>`, `finished/<workload>`): the
/// same event, re-published after a crash, is stored once.
pub fn event_id(key: &str) -> Uuid {
    Uuid::new_v5(&EVENT_ID_NAMESPACE, key.as_bytes())
}

/// Checks a submission as `allot submit` would — against the teams file and, when nodes have
/// registered, the node shapes of `cluster` — and builds its state, every task waiting; or
/// says, precisely, why not. `at` is when it was submitted (ms since the Unix epoch, the
/// scheduler's clock): a deadline given as a duration counts from then.
pub fn plan(
    submitted: &WorkloadSubmitted,
    at: Time,
    pool: &str,
    teams: Option<&TeamsConfig>,
    cluster: Option<&ClusterShape>,
) -> Result<Workload, String> {
    let id = &submitted.workload_id;
    allot_events::subject::validate_token("workload id", id).map_err(|e| e.to_string())?;
    // Through the text, so a raw submission gets every check a CLI one does (the schema's too).
    let text = serde_json::to_string(&submitted.spec).map_err(|e| e.to_string())?;
    let ctx = Context { teams, cluster };
    let checked = allot_workload::check(&text, Format::Json, ctx).map_err(|problems| {
        let all: Vec<String> = problems.iter().map(ToString::to_string).collect();
        format!("invalid workload {id}: {}", all.join("; "))
    })?;
    let spec = &checked.workload;
    let team = &spec.metadata.team;
    let gang_sizes = |gang: &str| {
        spec.spec
            .tasks
            .iter()
            .filter(|t| t.gang.as_deref() == Some(gang))
            .count() as u32
    };
    let ms = |text: &Option<String>| -> Option<Time> {
        // Validated already: every duration parses.
        text.as_deref()
            .and_then(|d| quantity::duration(d).ok())
            .map(|d| d.as_millis() as Time)
    };
    let tasks = spec
        .spec
        .tasks
        .iter()
        .map(|t| {
            let request = &checked.requests[&t.name];
            let mut template = TaskSpec::new(0, team.clone(), request.gpus);
            template.priority = checked.priority;
            template.gpu_milli = request.gpu_milli;
            template.gpu_models.clone_from(&request.gpu_models);
            template.gpu_memory_mib = request.gpu_memory_mib;
            template.mig_profile.clone_from(&request.mig_profile);
            template.cpu_milli = request.cpu_milli;
            template.memory_mib = request.memory_mib;
            template.gang = t.gang.as_ref().map(|g| Gang {
                name: format!("{id}/{g}"),
                size: gang_sizes(g),
            });
            template.dag = checked.dag[&t.name];
            template.predicted_duration = ms(&t.duration_estimate);
            template.checkpoint_every = t
                .checkpoint
                .as_ref()
                .filter(|c| c.supported)
                .and_then(|c| ms(&c.interval));
            template.max_runtime = ms(&t.max_runtime);
            // Validated already: every deadline parses.
            template.deadline = t
                .deadline
                .as_deref()
                .and_then(|d| quantity::deadline(d).ok())
                .map(|d| match d {
                    quantity::Deadline::AfterSubmit(after) => {
                        at.saturating_add(after.as_millis() as Time)
                    }
                    quantity::Deadline::At(when) => when.timestamp_millis().max(0) as Time,
                });
            let run = RunSpec {
                attempt: 0,
                command: t.command.clone(),
                image: t.image.clone(),
                duration_ms: template.predicted_duration,
                checkpoint: t.checkpoint.as_ref().is_some_and(|c| c.supported),
                checkpoint_every_ms: template.checkpoint_every,
                max_runtime_ms: template.max_runtime,
                no_idle_reclaim: t.idle_reclaim == Some(false),
            };
            let retry = t.retry.as_ref();
            Task {
                name: t.name.clone(),
                after: t.after.clone(),
                gang: t.gang.clone(),
                status: TaskStatus::Waiting,
                attempt: 1,
                max_attempts: retry.map_or(1, |r| r.max_attempts),
                backoff: retry.and_then(|r| ms(&r.backoff)).unwrap_or(0),
                template,
                run,
                started: None,
                predicted: None,
                reason: None,
                right_size: request.right_size,
            }
        })
        .collect();
    Ok(Workload {
        id: id.clone(),
        team: team.clone(),
        pool: pool.to_owned(),
        status: WorkloadStatus::Running,
        reason: None,
        tasks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_counts_from_the_submission_or_is_the_time_it_names() {
        let yaml = "apiVersion: allot/v1\nkind: Workload\nmetadata: {name: w, team: vision}\n\
                    spec:\n  tasks:\n\
                    \x20   - {name: a, command: [a], deadline: 6h}\n\
                    \x20   - {name: b, command: [b], deadline: \"2026-12-01T18:00:00Z\"}\n\
                    \x20   - {name: c, command: [c]}\n";
        let checked = allot_workload::check(yaml, Format::Yaml, Context::default()).unwrap();
        let submitted = WorkloadSubmitted {
            workload_id: "w-0123456789".into(),
            idempotency_key: "k".into(),
            run_id: None,
            submitter: "ci".into(),
            spec: checked.workload,
        };
        let at = 1_764_000_000_000;
        let w = plan(&submitted, at, "default", None, None).unwrap();
        let deadlines: Vec<Option<Time>> = w.tasks.iter().map(|t| t.template.deadline).collect();
        assert_eq!(
            deadlines,
            [Some(at + 6 * 3_600_000), Some(1_796_148_000_000), None]
        );
    }
}

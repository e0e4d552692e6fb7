//! How large a spec may be, so that what `allot validate` accepts `allot submit` can publish
//! and the planner accepts: one limit, checked by [`crate::check`] wherever a spec is read.
//!
//! A submission travels as one NATS message: the spec as compact JSON inside the
//! `WorkloadSubmitted` CloudEvent, and nats-server refuses payloads over `max_payload`, 1 MiB by
//! default. Half of that for the spec leaves the envelope (ids, key, run id, submitter) ample
//! room, whether the spec was written as YAML or JSON.

use std::time::Duration;

use allot_events::workload::Workload;

use crate::problem::{ProblemKind, SpecProblem};

/// The largest spec, in bytes: both the text as written and the spec as published (compact
/// JSON, which is larger than compact YAML).
pub const MAX_SPEC_BYTES: usize = 512 * 1024;

/// The most tasks in one workload; a larger pipeline is several workloads.
pub const MAX_TASKS: usize = 5_000;

/// The longest duration a spec may give (`durationEstimate`, `maxRuntime`, `deadline`,
/// `retry.backoff`, `checkpoint.interval`): 365 days. Durations travel as milliseconds; a
/// limit far below `u64::MAX` ms keeps every sum and conversion of them exact.
pub const MAX_DURATION: Duration = Duration::from_secs(MAX_DURATION_DAYS * 24 * 3600);

/// [`MAX_DURATION`] in days, for messages.
pub const MAX_DURATION_DAYS: u64 = 365;

/// How large a spec was found to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecSize {
    /// Exactly this many bytes.
    Bytes(u64),
    /// More than this many bytes: reading stopped there (standard input is not read to its end).
    MoreThan(u64),
}

/// The problem of a spec larger than [`MAX_SPEC_BYTES`].
pub fn too_large(size: SpecSize) -> SpecProblem {
    let size = match size {
        SpecSize::Bytes(n) => format!("{n} bytes"),
        SpecSize::MoreThan(n) => format!("more than {n} bytes (reading stopped there)"),
    };
    SpecProblem::new(
        ProblemKind::TooLarge,
        "",
        format!(
            "the spec is {size}; at most {MAX_SPEC_BYTES} bytes (512 KiB), so the submission fits \
             in one NATS message — split the workload"
        ),
    )
}

/// The text of a spec read as bytes: the size limit first (nothing larger is looked into),
/// then UTF-8.
pub fn text(bytes: Vec<u8>) -> Result<String, SpecProblem> {
    if bytes.len() > MAX_SPEC_BYTES {
        return Err(too_large(SpecSize::Bytes(bytes.len() as u64)));
    }
    String::from_utf8(bytes).map_err(|e| {
        let bytes = e.as_bytes();
        let at = e.utf8_error().valid_up_to();
        let before = &bytes[..at];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let line_start = before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        // The prefix is valid UTF-8, so the column counts characters as the parsers do.
        let column = String::from_utf8_lossy(&before[line_start..])
            .chars()
            .count()
            + 1;
        let mut problem = SpecProblem::new(
            ProblemKind::Syntax,
            "",
            format!(
                "not UTF-8 at byte {} (0x{:02x}): a spec is UTF-8 text (was it saved as Latin-1 \
                 or UTF-16?)",
                at + 1,
                bytes[at]
            ),
        );
        problem.line_column = Some((line, column));
        problem
    })
}

/// The limits a parsed workload can break: its size as published and its number of tasks.
pub(crate) fn workload(workload: &Workload, out: &mut Vec<SpecProblem>) {
    let published = serde_json::to_vec(workload).map_or(0, |json| json.len());
    if published > MAX_SPEC_BYTES {
        out.push(SpecProblem::new(
            ProblemKind::TooLarge,
            "",
            format!(
                "the spec is {published} bytes as published (compact JSON); at most \
                 {MAX_SPEC_BYTES} bytes (512 KiB), so the submission fits in one NATS message — \
                 split the workload"
            ),
        ));
    }
    let tasks = workload.spec.tasks.len();
    if tasks > MAX_TASKS {
        out.push(SpecProblem::new(
            ProblemKind::TooLarge,
            "spec.tasks",
            format!("{tasks} tasks; at most {MAX_TASKS} in one workload — split the workload"),
        ));
    }
}

#[cfg(test)]
mod tests;

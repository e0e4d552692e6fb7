//! The KPIs of DESIGN.md, computed the same way for every policy.
//!
//! - JCT = finish − submit; queueing delay = first start − submit; averages and percentiles over
//!   all jobs; makespan = last finish − first submit.
//! - GPU allocation ratio = allocated GPU·s / capacity GPU·s over the makespan.
//! - Wastage Ratio (WR) = fraction of the makespan during which some GPU capacity was idle while
//!   at least one task waited; WR_fit counts only moments when a waiting task could have been
//!   placed on the idle capacity alone.
//! - Jain's fairness over teams of x = GPU·s received / GPU·s entitled, where a team's
//!   entitlement is its nominal share (nominal quota / all nominal quotas) of the GPU·s actually
//!   allocated. Every job of a trace eventually runs, so entitlement is measured against what
//!   was handed out, not against capacity that nobody asked for.
//! - ETA accuracy, over jobs that waited more than [`ETA_MIN_WAIT`]: the relative error of the
//!   first start time the scheduler promised a job while it waited, |ETA − first start| /
//!   (first start − submit) — its median, and the share within 25%. Jobs that waited that long
//!   and were never promised a start are counted apart, so a scheduler cannot look accurate by
//!   staying silent.

use std::collections::BTreeMap;

use crate::trace::Millis;

/// How one job went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobOutcome {
    /// Trace position.
    pub id: u32,
    /// Team.
    pub team: String,
    /// Submitted at.
    pub submit: Millis,
    /// First started at.
    pub first_start: Millis,
    /// Finished at.
    pub finish: Millis,
    /// GPU·ms received (milli-GPU × ms / 1000).
    pub gpu_ms: u128,
    /// The first start it was promised by a `Waiting` decision before its first run (`None`:
    /// no decision gave it one).
    pub eta: Option<Eta>,
    /// The start [`allot_sched::Scheduler::waiting`] promised right after the pass at its
    /// submission, as `allot` would answer a user who asks then (`None`: it started in that
    /// pass, or was given no ETA).
    pub eta_at_submit: Option<Eta>,
    /// When it should have been done, if it had a deadline.
    pub deadline: Option<Millis>,
}

/// How many of the jobs (or pipelines) with a deadline finished by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeadlinesMet {
    /// Those with a deadline.
    pub with: usize,
    /// Those that finished at or before it.
    pub met: usize,
}

impl DeadlinesMet {
    /// Counts `(finish, deadline)` pairs.
    pub fn of(outcomes: impl IntoIterator<Item = (Millis, Option<Millis>)>) -> Self {
        let mut counts = Self::default();
        for (finish, deadline) in outcomes {
            if let Some(deadline) = deadline {
                counts.with += 1;
                counts.met += usize::from(finish <= deadline);
            }
        }
        counts
    }

    /// The share met (`None` when none had a deadline).
    pub fn share(&self) -> Option<f64> {
        (self.with > 0).then(|| self.met as f64 / self.with as f64)
    }
}

/// A start time the scheduler promised a waiting job (a `Waiting` decision's `eta`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Eta {
    /// When it was expected to start.
    pub start: Millis,
    /// When the scheduler said so.
    pub given_at: Millis,
}

/// Jobs that waited at most this long are left out of the ETA accuracy: nobody asks when a
/// job will start that starts within a minute, and dividing by a wait of a few ms would let
/// them dominate the relative error.
pub const ETA_MIN_WAIT: Millis = 60_000;

/// How well the ETAs given to waiting jobs matched their actual starts (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EtaAccuracy {
    /// Jobs that waited more than [`ETA_MIN_WAIT`] and were given an ETA.
    pub jobs: usize,
    /// Jobs that waited more than [`ETA_MIN_WAIT`] and were never given one.
    pub missing: usize,
    /// Median over `jobs` of |ETA − start| / wait (`None` when `jobs` is 0).
    pub median_rel_error: Option<f64>,
    /// Share of `jobs` whose relative error is at most 0.25 (`None` when `jobs` is 0).
    pub within_25pct: Option<f64>,
}

/// The KPIs of one simulated run.
#[derive(Debug, Clone, PartialEq)]
pub struct Kpis {
    /// Jobs finished.
    pub jobs: usize,
    /// Average JCT, s.
    pub avg_jct_s: f64,
    /// Median JCT, s.
    pub p50_jct_s: f64,
    /// 95th percentile JCT, s.
    pub p95_jct_s: f64,
    /// 99th percentile JCT, s.
    pub p99_jct_s: f64,
    /// Average queueing delay, s.
    pub avg_queue_s: f64,
    /// Makespan, s.
    pub makespan_s: f64,
    /// Allocated / capacity GPU·s.
    pub gpu_allocation_ratio: f64,
    /// Wastage Ratio.
    pub wastage_ratio: f64,
    /// Wastage Ratio counting only moments when a waiting task fit on idle capacity.
    pub wastage_ratio_fit: f64,
    /// Jain's index over teams.
    pub jain_fairness: f64,
    /// Preemptions.
    pub preemptions: u64,
    /// GPU-hours of work lost to preemptions.
    pub gpu_hours_lost: f64,
    /// How well the ETAs of `Waiting` decisions held ([`JobOutcome::eta`]).
    pub eta: EtaAccuracy,
    /// How well the ETAs given at submission held ([`JobOutcome::eta_at_submit`]).
    pub eta_at_submit: EtaAccuracy,
    /// Jobs with a deadline, and how many finished by it.
    pub deadlines: DeadlinesMet,
}

/// Time-weighted accumulators the engine feeds between events.
#[derive(Debug, Clone, Default)]
pub struct Accumulators {
    /// Milli-GPU × ms allocated.
    pub allocated: u128,
    /// Milli-GPU × ms of capacity.
    pub capacity: u128,
    /// ms with idle capacity and a waiting task.
    pub wasted: u128,
    /// ms with idle capacity and a waiting task that fit on it.
    pub wasted_fit: u128,
    /// Preemptions.
    pub preemptions: u64,
    /// Milli-GPU × ms of work lost to preemptions.
    pub lost: u128,
}

/// Computes the KPIs from the outcomes, the accumulators and the teams' nominal quotas.
pub fn compute(
    outcomes: &[JobOutcome],
    acc: &Accumulators,
    nominal: &BTreeMap<String, u32>,
) -> Kpis {
    let n = outcomes.len().max(1) as f64;
    let mut jct: Vec<Millis> = outcomes.iter().map(|o| o.finish - o.submit).collect();
    jct.sort_unstable();
    let queue: u128 = outcomes
        .iter()
        .map(|o| u128::from(o.first_start - o.submit))
        .sum();
    let first = outcomes.iter().map(|o| o.submit).min().unwrap_or(0);
    let last = outcomes.iter().map(|o| o.finish).max().unwrap_or(0);
    let makespan = last.saturating_sub(first);
    let s = |ms: f64| ms / 1000.0;
    let ratio = |a: u128, b: u128| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    Kpis {
        jobs: outcomes.len(),
        avg_jct_s: s(jct.iter().map(|j| *j as f64).sum::<f64>() / n),
        p50_jct_s: s(percentile(&jct, 50.0)),
        p95_jct_s: s(percentile(&jct, 95.0)),
        p99_jct_s: s(percentile(&jct, 99.0)),
        avg_queue_s: s(queue as f64 / n),
        makespan_s: s(makespan as f64),
        gpu_allocation_ratio: ratio(acc.allocated, acc.capacity),
        wastage_ratio: ratio(acc.wasted, u128::from(makespan)),
        wastage_ratio_fit: ratio(acc.wasted_fit, u128::from(makespan)),
        jain_fairness: jain(outcomes, nominal),
        preemptions: acc.preemptions,
        gpu_hours_lost: acc.lost as f64 / 1000.0 / 3_600_000.0,
        eta: eta_accuracy(outcomes, |o| o.eta),
        eta_at_submit: eta_accuracy(outcomes, |o| o.eta_at_submit),
        deadlines: DeadlinesMet::of(outcomes.iter().map(|o| (o.finish, o.deadline))),
    }
}

/// The accuracy of the ETAs `promised` to the jobs that waited more than [`ETA_MIN_WAIT`].
pub fn eta_accuracy(
    outcomes: &[JobOutcome],
    promised: impl Fn(&JobOutcome) -> Option<Eta>,
) -> EtaAccuracy {
    let mut errors: Vec<f64> = Vec::new();
    let mut missing = 0;
    for o in outcomes {
        let wait = o.first_start - o.submit;
        if wait <= ETA_MIN_WAIT {
            continue;
        }
        match promised(o) {
            Some(eta) => errors.push(eta.start.abs_diff(o.first_start) as f64 / wait as f64),
            None => missing += 1,
        }
    }
    errors.sort_unstable_by(f64::total_cmp);
    let within = errors.iter().filter(|e| **e <= 0.25).count();
    EtaAccuracy {
        jobs: errors.len(),
        missing,
        // Nearest rank, as the JCT percentiles.
        median_rel_error: (!errors.is_empty()).then(|| errors[errors.len().div_ceil(2) - 1]),
        within_25pct: (!errors.is_empty()).then(|| within as f64 / errors.len() as f64),
    }
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[Millis], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64
}

fn jain(outcomes: &[JobOutcome], nominal: &BTreeMap<String, u32>) -> f64 {
    let mut received: BTreeMap<&str, u128> = BTreeMap::new();
    for o in outcomes {
        *received.entry(o.team.as_str()).or_default() += o.gpu_ms;
    }
    let total: u128 = received.values().sum();
    let nominal_total: u64 = nominal.values().map(|v| u64::from(*v)).sum();
    if total == 0 || nominal_total == 0 {
        return 1.0;
    }
    let xs: Vec<f64> = nominal
        .iter()
        .map(|(team, quota)| {
            let entitled = total as f64 * f64::from(*quota) / nominal_total as f64;
            received.get(team.as_str()).copied().unwrap_or(0) as f64 / entitled
        })
        .collect();
    let sum: f64 = xs.iter().sum();
    let squares: f64 = xs.iter().map(|x| x * x).sum();
    if squares == 0.0 {
        1.0
    } else {
        sum * sum / (xs.len() as f64 * squares)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(team: &str, submit: Millis, start: Millis, finish: Millis, gpus: u128) -> JobOutcome {
        JobOutcome {
            id: 0,
            team: team.into(),
            submit,
            first_start: start,
            finish,
            gpu_ms: gpus * u128::from(finish - start),
            eta: None,
            eta_at_submit: None,
            deadline: None,
        }
    }

    #[test]
    fn a_deadline_is_met_by_finishing_at_or_before_it() {
        let met = DeadlinesMet::of([(10, Some(10)), (11, Some(10)), (5, None), (3, Some(9))]);
        assert_eq!(met, DeadlinesMet { with: 3, met: 2 });
        assert_eq!(DeadlinesMet::of([(1, None)]).share(), None);
    }

    #[test]
    fn jct_queueing_and_makespan_follow_their_definitions() {
        let outcomes = [job("a", 0, 0, 10_000, 1), job("a", 1_000, 5_000, 21_000, 1)];
        let k = compute(&outcomes, &Accumulators::default(), &BTreeMap::new());
        assert_eq!(k.avg_jct_s, 15.0);
        assert_eq!(k.avg_queue_s, 2.0);
        assert_eq!(k.makespan_s, 21.0);
        assert_eq!((k.p50_jct_s, k.p99_jct_s), (10.0, 20.0));
    }

    #[test]
    fn jain_is_one_when_teams_receive_their_shares_and_falls_when_one_is_starved() {
        let quotas = BTreeMap::from([("a".to_owned(), 2), ("b".to_owned(), 1)]);
        let fair = [job("a", 0, 0, 1_000, 2), job("b", 0, 0, 1_000, 1)];
        assert!(
            (compute(&fair, &Accumulators::default(), &quotas).jain_fairness - 1.0).abs() < 1e-9
        );
        let starved = [job("a", 0, 0, 1_000, 3)];
        let j = compute(&starved, &Accumulators::default(), &quotas).jain_fairness;
        assert!((j - 0.5).abs() < 1e-9, "{j}");
    }

    #[test]
    fn eta_accuracy_counts_long_waits_only_and_the_silent_ones_apart() {
        let waited = |wait: Millis, eta: Option<Millis>| JobOutcome {
            eta: eta.map(|start| Eta { start, given_at: 0 }),
            ..job("a", 0, wait, wait + 1_000, 1)
        };
        let outcomes = [
            // Under a minute: left out however wrong its ETA.
            waited(30_000, Some(900_000)),
            waited(60_000, None),
            // On time; 50 s late on a 200 s wait (0.25, still within); 200 s early on 400 s.
            waited(100_000, Some(100_000)),
            waited(200_000, Some(250_000)),
            waited(400_000, Some(200_000)),
            // Waited long, promised nothing.
            waited(120_000, None),
        ];
        let eta = compute(&outcomes, &Accumulators::default(), &BTreeMap::new()).eta;
        assert_eq!(
            eta,
            EtaAccuracy {
                jobs: 3,
                missing: 1,
                median_rel_error: Some(0.25),
                within_25pct: Some(2.0 / 3.0),
            }
        );
        assert_eq!(
            eta_accuracy(&outcomes[..2], |o| o.eta),
            EtaAccuracy::default(),
            "no long wait: nothing to measure, and no median made up"
        );
    }
}

//! The reporter: publishes what the inventory concludes — a node went silent or came back, a
//! GPU's health changed — and records what it published, so each change is announced once.
//!
//! It reads the projection, never changes it: the projection is a pure function of the events,
//! and the reporter's `reported_*` columns only remember what was already said.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use allot_bus::Publisher;
use allot_events::AnyEvent;
use allot_events::inventory::{GpuHealthChanged, NodeRecovered, NodeUnreachable};
use allot_store::rusqlite::{self, Connection, params};

use crate::health;

/// When a node counts as unreachable.
#[derive(Debug, Clone, Copy)]
pub struct Liveness {
    /// How often collectors send heartbeats.
    pub heartbeat_interval: Duration,
    /// Heartbeats a node may miss before it is unreachable.
    pub missed_heartbeats: u32,
}

impl Liveness {
    fn deadline(&self) -> chrono::Duration {
        chrono::Duration::from_std(self.heartbeat_interval * self.missed_heartbeats)
            .unwrap_or(chrono::Duration::MAX)
    }
}

/// A conclusion to publish, and how to remember that it was published.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Change {
    Unreachable(NodeUnreachable),
    Recovered(NodeRecovered),
    Health(GpuHealthChanged),
}

impl Change {
    fn event(&self) -> AnyEvent {
        match self.clone() {
            Self::Unreachable(e) => e.into(),
            Self::Recovered(e) => e.into(),
            Self::Health(e) => e.into(),
        }
    }

    fn record(&self, conn: &Connection) -> Result<(), rusqlite::Error> {
        match self {
            Self::Unreachable(e) => conn.execute(
                "UPDATE nodes SET reported_reachable = 0 WHERE name = ?1",
                [&e.node],
            ),
            Self::Recovered(e) => conn.execute(
                "UPDATE nodes SET reported_reachable = 1 WHERE name = ?1",
                [&e.node],
            ),
            Self::Health(e) => conn.execute(
                "UPDATE gpus SET reported_health = ?2 WHERE uuid = ?1",
                params![e.gpu_uuid, health::as_str(e.to)],
            ),
        }
        .map(|_| ())
    }
}

/// A node as liveness judges it: its name, its last heartbeat (or registration), and whether
/// it was last reported reachable.
pub(crate) type Heard = (String, DateTime<Utc>, bool);

/// Whether the whole fleet has gone quiet at once, which says more about the bus than about the
/// nodes: a NATS server lost with the stream electing a new leader (the collectors' heartbeats
/// cannot be stored meanwhile), or the inventory's own consumer stalled. While it is, silence
/// counts for no node; once any node is heard again, every node has a full deadline from the
/// last quiet moment to be heard too. Kubernetes' node lifecycle controller reasons the same
/// way: when every node of a zone is NotReady ("full disruption") it stops evicting.
///
/// The fleet is quiet when at least two nodes are reported reachable and none was heard for
/// one and a half heartbeat intervals (with two or more nodes beating, some heartbeat arrives
/// every interval). A fleet quiet for longer than four deadlines is believed: its nodes are
/// then judged as if it were not, since a bus that long away, or a fleet that long dead, is
/// worth saying so. One node alone is judged as before.
#[derive(Debug, Default)]
pub(crate) struct Quiet {
    /// Since when the fleet has been quiet, while it is.
    since: Option<DateTime<Utc>>,
    /// Silence before this counts for no node.
    floor: Option<DateTime<Utc>>,
}

impl Quiet {
    /// Updates from what was heard at `now`; the time before which silence does not count.
    fn floor(
        &mut self,
        heard: &[Heard],
        liveness: Liveness,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        let reachable = heard.iter().filter(|(_, _, r)| *r).count();
        let newest = heard.iter().map(|(_, last, _)| *last).max();
        let quiet_after = chrono::Duration::from_std(liveness.heartbeat_interval * 3 / 2)
            .unwrap_or(chrono::Duration::MAX);
        let quiet = reachable >= 2 && newest.is_some_and(|n| now - n > quiet_after);
        match (quiet, self.since) {
            (true, None) => {
                tracing::warn!(
                    nodes = reachable,
                    "no node heard for {} ms: suspecting the bus rather than the nodes, so none \
                     is declared unreachable while the whole fleet is quiet",
                    newest.map_or(0, |n| (now - n).num_milliseconds())
                );
                self.since = Some(now);
            }
            (false, Some(since)) => {
                tracing::info!(
                    quiet_ms = (now - since).num_milliseconds(),
                    "the fleet is heard again; each node has a full deadline from now"
                );
                self.since = None;
            }
            _ => {}
        }
        let believed = liveness
            .deadline()
            .checked_mul(4)
            .unwrap_or(chrono::Duration::MAX);
        if self.since.is_some_and(|since| now - since <= believed) {
            self.floor = Some(now);
        }
        self.floor
    }
}

/// What should be published now. `judge_liveness` is false during the start-up grace period,
/// while the inventory may still be catching up on heartbeats.
pub(crate) fn changes(
    conn: &Connection,
    liveness: Liveness,
    now: DateTime<Utc>,
    judge_liveness: bool,
    quiet: &mut Quiet,
) -> Result<Vec<Change>, rusqlite::Error> {
    let mut nodes = conn.prepare_cached(
        "SELECT name, coalesce(last_heartbeat_at, registered_at), reported_reachable FROM nodes
         ORDER BY name",
    )?;
    let rows = nodes.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, i64>(2)? == 1,
        ))
    })?;
    let mut heard = Vec::new();
    for row in rows {
        let (node, last, reported_reachable) = row?;
        if let Ok(last) = DateTime::parse_from_rfc3339(&last) {
            heard.push((node, last.with_timezone(&Utc), reported_reachable));
        }
    }
    let mut out = liveness_changes(&heard, liveness, now, judge_liveness, quiet);
    let mut gpus = conn.prepare_cached(
        "SELECT node, uuid, idx, reported_health, health, health_reason FROM gpus
         WHERE health != reported_health ORDER BY node, idx",
    )?;
    let rows = gpus.query_map([], |r| {
        Ok(GpuHealthChanged {
            node: r.get(0)?,
            gpu_uuid: r.get(1)?,
            index: r.get(2)?,
            from: health::parse(&r.get::<_, String>(3)?),
            to: health::parse(&r.get::<_, String>(4)?),
            reason: {
                let reason: String = r.get(5)?;
                if reason.is_empty() {
                    "no symptoms in the latest sample".into()
                } else {
                    reason
                }
            },
        })
    })?;
    for row in rows {
        out.push(Change::Health(row?));
    }
    Ok(out)
}

/// Nodes to declare unreachable, or reachable again.
pub(crate) fn liveness_changes(
    heard: &[Heard],
    liveness: Liveness,
    now: DateTime<Utc>,
    judge_liveness: bool,
    quiet: &mut Quiet,
) -> Vec<Change> {
    let deadline = liveness.deadline();
    let floor = quiet.floor(heard, liveness, now);
    let mut out = Vec::new();
    for (node, last, reported_reachable) in heard {
        let (node, last) = (node.clone(), *last);
        let silent = now - last;
        let counted = now - floor.map_or(last, |f| f.max(last));
        if *reported_reachable && counted > deadline && judge_liveness {
            let missed =
                silent.num_milliseconds() / (liveness.heartbeat_interval.as_millis().max(1) as i64);
            out.push(Change::Unreachable(NodeUnreachable {
                node,
                last_heartbeat_at: last,
                missed_heartbeats: missed.clamp(0, u32::MAX as i64) as u32,
            }));
        } else if !reported_reachable && silent <= deadline {
            out.push(Change::Recovered(NodeRecovered {
                node,
                last_heartbeat_at: last,
            }));
        }
    }
    out
}

/// The reporter loop.
#[derive(Debug)]
pub(crate) struct Reporter {
    pub(crate) conn: Connection,
    pub(crate) publisher: Publisher,
    pub(crate) liveness: Liveness,
    pub(crate) tick: Duration,
    pub(crate) quiet: Quiet,
}

/// Whether liveness may be judged at a tick of the reporter: not during a grace period — after
/// the start, and again after the reporter went a while without ticking — while the inventory
/// may still be catching up on heartbeats.
///
/// A process that was paused or starved (SIGSTOP, a stalled VM, a publish that waited on an
/// election) wakes with every node's last heartbeat as old as the pause, before its consumer has
/// applied the heartbeats that arrived meanwhile: judged then, the whole fleet would be declared
/// unreachable for a moment, and the allocator would stop placing work on it (the fault matrix
/// saw it, `tests/e2e/faults.rs`).
#[derive(Debug)]
pub(crate) struct Judgement {
    grace: Duration,
    /// The longest gap between two ticks that is not a stall.
    stall: Duration,
    since: Instant,
    last: Instant,
}

impl Judgement {
    /// Starting at `now`, for a reporter ticking every `tick`.
    pub(crate) fn new(now: Instant, liveness: Liveness, tick: Duration) -> Self {
        Self {
            grace: liveness.heartbeat_interval * liveness.missed_heartbeats,
            stall: liveness.heartbeat_interval.max(tick * 2),
            since: now,
            last: now,
        }
    }

    /// Whether liveness may be judged at the tick at `now`.
    pub(crate) fn at(&mut self, now: Instant) -> bool {
        let gap = now.saturating_duration_since(self.last);
        if gap > self.stall {
            tracing::info!(
                stalled_ms = gap.as_millis() as u64,
                "the reporter did not run for a while (paused or starved); judging liveness again \
                 once the heartbeats are caught up"
            );
            self.since = now;
        }
        self.last = now;
        now.saturating_duration_since(self.since) >= self.grace
    }

    /// The tick's own work ended at `now`: a report that took long (many changes to publish)
    /// is no stall.
    pub(crate) fn ended(&mut self, now: Instant) {
        self.last = self.last.max(now);
    }
}

impl Reporter {
    pub(crate) async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut judgement = Judgement::new(Instant::now(), self.liveness, self.tick);
        let mut tick = tokio::time::interval(self.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                _ = tick.tick() => {}
            }
            let judge_liveness = judgement.at(Instant::now());
            if let Err(e) = self.report(judge_liveness).await {
                tracing::warn!(error = %e, "reporting inventory changes failed; will retry");
            }
            judgement.ended(Instant::now());
        }
    }

    async fn report(&mut self, judge_liveness: bool) -> Result<(), String> {
        let changes = changes(
            &self.conn,
            self.liveness,
            Utc::now(),
            judge_liveness,
            &mut self.quiet,
        )
        .map_err(|e| e.to_string())?;
        for change in changes {
            self.publisher
                .publish(change.event())
                .await
                .map_err(|e| e.to_string())?;
            // If we die between the publish and this update, the change is announced again on
            // restart: consumers of inventory events treat them as idempotent state changes.
            change.record(&self.conn).map_err(|e| e.to_string())?;
            match &change {
                Change::Unreachable(e) => {
                    tracing::warn!(node = %e.node, missed = e.missed_heartbeats, "node unreachable")
                }
                Change::Recovered(e) => tracing::info!(node = %e.node, "node reachable again"),
                Change::Health(e) => {
                    tracing::warn!(node = %e.node, gpu = e.index, from = ?e.from, to = ?e.to, reason = %e.reason, "GPU health changed")
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;

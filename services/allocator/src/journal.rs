//! The pool's journal: reading it back to rebuild the scheduler, and appending to it under
//! fencing.
//!
//! The leader applies inputs to its scheduler and *stages* their entries; [`Journal::commit`]
//! then appends everything staged as one atomic batch (ADR-50): all of it or none, in one
//! round trip, so the journal's speed is one round trip per batch of inputs rather than per
//! input. The batch's first message carries `Nats-Expected-Last-Subject-Sequence` = the
//! sequence of the journal's last message this leader knows, checked when the batch commits.
//! If anyone else has appended since — a new leader after this one lost its lease — the server
//! rejects the whole batch, and this leader stops: a deposed leader can never interleave
//! decisions with its successor's. Nothing staged leaves the process before its commit (the
//! executors' orders travel in the journal itself), and a leader whose commit failed drops its
//! scheduler with the staged entries and rebuilds from the journal.

use std::collections::{BTreeMap, HashMap};

use async_nats::jetstream::{self, consumer::DeliverPolicy, message::PublishMessage};
use bytes::Bytes;
use futures::StreamExt;

use allot_bus::{ATOMIC_BATCH_MAX, PublishError, Publisher};
use allot_events::alloc::{Applied, Dispatch, Launch, LeaderElected, Source};
use allot_events::{AllocEvent, AnyEvent, Envelope, decode, subject};
use allot_sched::journal::{self, Entry};
use allot_sched::{ApplyError, Decision, Input, Scheduler, TaskId, TaskSpec, Time};

/// The journal cannot be read or continued.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// Someone else appended first: this allocator no longer leads.
    #[error(
        "deposed: {by} appended to the journal of pool {pool} (stream sequence {theirs}) after \
         this allocator's last entry (stream sequence {ours})"
    )]
    Deposed {
        /// The pool.
        pool: String,
        /// The journal's last message as this allocator knew it.
        ours: u64,
        /// The journal's last message now.
        theirs: u64,
        /// Who wrote it (the event's source), as far as it can be read.
        by: String,
    },
    /// The bus failed.
    #[error("journal of pool {pool}: {why}")]
    Bus {
        /// The pool.
        pool: String,
        /// What failed.
        why: String,
    },
    /// A journal message is not a journal event.
    #[error("journal of pool {pool}, stream sequence {sequence}: {why}")]
    Unreadable {
        /// The pool.
        pool: String,
        /// Where.
        sequence: u64,
        /// Why.
        why: String,
    },
    /// Replaying the journal gave another outcome than the one logged: this build would not
    /// decide as the previous leader did, so it must not continue the journal.
    #[error(
        "journal of pool {pool}, entry {entry}: recomputing it gives another outcome than the \
         one logged; run `allot replay --verify` for both"
    )]
    Diverged {
        /// The pool.
        pool: String,
        /// The entry.
        entry: u64,
    },
    /// The journal was written under another policy.
    #[error("the journal of pool {pool} was written by policy {journal:?}, not {configured:?}")]
    PolicyChanged {
        /// The pool.
        pool: String,
        /// The journal's policy.
        journal: String,
        /// The configured one.
        configured: String,
    },
}

/// Every journal event of `pool`, with its stream sequence, in order.
pub async fn read(
    js: &jetstream::Context,
    pool: &str,
) -> Result<Vec<(u64, AllocEvent)>, JournalError> {
    let bus = |why: String| JournalError::Bus {
        pool: pool.to_owned(),
        why,
    };
    let subject = subject::alloc_journal(pool);
    let stream = js
        .get_stream(allot_bus::streams::names::DECISIONS)
        .await
        .map_err(|e| bus(e.to_string()))?;
    let last = match stream.get_last_raw_message_by_subject(&subject).await {
        Ok(m) => m.sequence,
        Err(e) if e.kind() == jetstream::stream::LastRawMessageErrorKind::NoMessageFound => {
            return Ok(Vec::new());
        }
        Err(e) => return Err(bus(e.to_string())),
    };
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            filter_subject: subject,
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .map_err(|e| bus(e.to_string()))?;
    let mut messages = consumer.messages().await.map_err(|e| bus(e.to_string()))?;
    let mut out = Vec::new();
    while let Some(message) = messages.next().await {
        let message = message.map_err(|e| bus(e.to_string()))?;
        let sequence = message
            .info()
            .map_err(|e| bus(e.to_string()))?
            .stream_sequence;
        let unreadable = |why: String| JournalError::Unreadable {
            pool: pool.to_owned(),
            sequence,
            why,
        };
        match decode(&message.payload)
            .map_err(|e| unreadable(e.to_string()))?
            .data
        {
            AnyEvent::Alloc(event) => out.push((sequence, event)),
            other => return Err(unreadable(format!("not a journal event: {other:?}"))),
        }
        if sequence >= last {
            break;
        }
    }
    Ok(out)
}

/// The scheduler as the journal leaves it.
#[derive(Debug)]
pub struct Rebuilt {
    /// The scheduler, every journalled input applied.
    pub scheduler: Scheduler,
    /// Per input stream, the last message whose input is journalled.
    pub positions: HashMap<String, u64>,
    /// The latest time of any journalled input (inputs never go back in time).
    pub last_at: Time,
    /// Tasks the pool cannot hold as it is (submitted before enough nodes joined): they are
    /// submitted again whenever capacity joins or returns.
    pub parked: BTreeMap<TaskId, TaskSpec>,
}

/// Whether a rejection means "not on this pool as it is now" (so worth trying again when
/// nodes join), rather than an invalid input.
pub fn parks(error: &ApplyError) -> bool {
    matches!(error, ApplyError::Unplaceable { .. })
}

/// Keeps `parked` in step with one journalled input and its outcome: a submission the pool
/// cannot hold parks its task; one accepted, or a withdrawal, unparks it. The leader and the
/// rebuild from the journal both go through here, so they cannot disagree.
pub fn track_parked(
    parked: &mut BTreeMap<TaskId, TaskSpec>,
    input: &Input,
    error: Option<&ApplyError>,
) {
    match input {
        Input::TaskSubmitted { task, .. } if error.is_some_and(parks) => {
            parked.insert(task.id, task.clone());
        }
        Input::TaskSubmitted { task, .. } if error.is_none() => {
            parked.remove(&task.id);
        }
        Input::TaskWithdrawn { task, .. } => {
            parked.remove(task);
        }
        _ => {}
    }
}

/// Appends to a pool's journal, fenced by the journal's last sequence.
#[derive(Debug)]
pub struct Journal {
    publisher: Publisher,
    pool: String,
    subject: String,
    /// Stream sequence of the journal's last message (0: empty).
    last: u64,
    /// Entries so far (the last entry's `seq`).
    entries: u64,
    /// How each task the scheduler holds runs, to dispatch its grants.
    launches: HashMap<TaskId, Launch>,
    /// Entries applied to the scheduler but not yet in the journal, as the envelopes that will
    /// carry them, in order.
    staged: Vec<Envelope>,
}

impl Journal {
    /// Reads the journal of `pool` and rebuilds the scheduler under `policy`, checking that
    /// every entry recomputes as logged.
    pub async fn open(
        publisher: Publisher,
        pool: &str,
        policy: &str,
    ) -> Result<(Journal, Rebuilt), JournalError> {
        let events = read(publisher.jetstream(), pool).await?;
        let mut rebuilt = Rebuilt {
            scheduler: Scheduler::new(allot_sched::policy::by_name(policy).ok_or_else(|| {
                JournalError::PolicyChanged {
                    pool: pool.into(),
                    journal: policy.into(),
                    configured: policy.into(),
                }
            })?),
            positions: HashMap::new(),
            last_at: 0,
            parked: BTreeMap::new(),
        };
        let mut journal = Journal {
            publisher,
            pool: pool.to_owned(),
            subject: subject::alloc_journal(pool),
            last: events.last().map_or(0, |(seq, _)| *seq),
            entries: 0,
            launches: HashMap::new(),
            staged: Vec::new(),
        };
        for (_, event) in events {
            match event {
                AllocEvent::LeaderElected(e) if e.policy != policy => {
                    return Err(JournalError::PolicyChanged {
                        pool: pool.into(),
                        journal: e.policy,
                        configured: policy.into(),
                    });
                }
                AllocEvent::LeaderElected(_) => {}
                AllocEvent::Applied(a) => {
                    let seq = a.entry.seq;
                    let (recomputed, error) =
                        journal::apply_typed(&mut rebuilt.scheduler, seq, a.entry.input.clone());
                    track_parked(&mut rebuilt.parked, &a.entry.input, error.as_ref());
                    if seq != journal.entries + 1 || recomputed != a.entry {
                        return Err(JournalError::Diverged {
                            pool: pool.into(),
                            entry: seq,
                        });
                    }
                    journal.entries = seq;
                    if let (Input::TaskSubmitted { task, .. }, Some(launch)) =
                        (&a.entry.input, a.launch)
                    {
                        journal.launches.insert(task.id, launch);
                    }
                    journal.forget_released(&a.entry);
                    if let Some(at) = a.entry.input.at() {
                        rebuilt.last_at = rebuilt.last_at.max(at);
                    }
                    if let Some(source) = a.source {
                        let p = rebuilt.positions.entry(source.stream).or_default();
                        *p = (*p).max(source.sequence);
                    }
                }
            }
        }
        Ok((journal, rebuilt))
    }

    /// Entries so far, staged ones included.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Announces that `leader` now leads with `policy`.
    pub async fn elected(&mut self, leader: &str, policy: &str) -> Result<(), JournalError> {
        let event = AllocEvent::LeaderElected(LeaderElected {
            pool: self.pool.clone(),
            leader: leader.into(),
            policy: policy.into(),
            format: journal::FORMAT.into(),
            entries: self.entries,
        });
        self.stage(event);
        self.commit().await
    }

    /// Applies `input` to `scheduler` and stages its entry (with the message it came from and,
    /// for a submitted task, how it runs) for the next [`Journal::commit`]; returns the entry
    /// and, if the scheduler rejected the input, why.
    pub fn apply(
        &mut self,
        scheduler: &mut Scheduler,
        input: Input,
        source: Option<Source>,
        launch: Option<Launch>,
    ) -> (Entry, Option<ApplyError>) {
        if let (Input::TaskSubmitted { task, .. }, Some(launch)) = (&input, &launch) {
            self.launches.insert(task.id, launch.clone());
        }
        let (entry, error) = journal::apply_typed(scheduler, self.entries + 1, input);
        let dispatch = self.dispatch(scheduler, &entry);
        self.stage(AllocEvent::Applied(Applied {
            pool: self.pool.clone(),
            source,
            entry: entry.clone(),
            launch,
            dispatch,
        }));
        self.entries += 1;
        self.forget_released(&entry);
        (entry, error)
    }

    /// The executors' orders for the grants among `entry`'s decisions: node names instead of
    /// the scheduler's node indices, and the launch the task was submitted with (a task
    /// submitted without one — by a test, or before launches were journalled — runs nothing
    /// but a simulation of its estimate).
    fn dispatch(&self, scheduler: &Scheduler, entry: &Entry) -> Vec<Dispatch> {
        Dispatch::for_grants(&entry.decisions, scheduler.cluster(), |task| {
            self.launches.get(&task).cloned().unwrap_or_else(|| Launch {
                workload: String::new(),
                name: task.to_string(),
                team: String::new(),
                run: Default::default(),
            })
        })
    }

    /// Drops the launches of tasks whose leases `entry` released for good.
    fn forget_released(&mut self, entry: &Entry) {
        for d in &entry.decisions {
            if let Decision::Released { task, .. } = d {
                self.launches.remove(task);
            }
        }
    }

    /// Runs a scheduling pass at `at`; stages it only if it decided something (see the
    /// leader's docs for why an empty pass need not be journalled).
    pub fn pass(&mut self, scheduler: &mut Scheduler, at: Time) {
        let started = std::time::Instant::now();
        let entry = journal::apply(scheduler, self.entries + 1, Input::Schedule { at });
        crate::metrics::pass_took(&self.pool, started.elapsed());
        if entry.decisions.is_empty() && entry.rejected.is_none() {
            return;
        }
        let dispatch = self.dispatch(scheduler, &entry);
        self.stage(AllocEvent::Applied(Applied {
            pool: self.pool.clone(),
            source: None,
            entry: entry.clone(),
            launch: None,
            dispatch,
        }));
        self.entries += 1;
        self.forget_released(&entry);
    }

    /// Says who wrote the journal's last message, for the deposition.
    async fn deposed(&self) -> JournalError {
        let last = async {
            let stream = self
                .publisher
                .jetstream()
                .get_stream(allot_bus::streams::names::DECISIONS)
                .await
                .ok()?;
            let message = stream
                .get_last_raw_message_by_subject(&self.subject)
                .await
                .ok()?;
            let by = decode(&message.payload).map_or_else(
                |_| "an unreadable message".to_owned(),
                |e| {
                    format!(
                        "allocator {}",
                        e.source.trim_start_matches("/allot/allocator/")
                    )
                },
            );
            Some((message.sequence, by))
        }
        .await;
        let (theirs, by) = last.unwrap_or((0, "another allocator".to_owned()));
        JournalError::Deposed {
            pool: self.pool.clone(),
            ours: self.last,
            theirs,
            by,
        }
    }

    fn stage(&mut self, event: AllocEvent) {
        self.staged.push(self.publisher.envelope(event));
    }

    /// Appends everything staged, in order, as atomic batches of at most [`ATOMIC_BATCH_MAX`]
    /// messages, each fenced by the journal's last sequence (see the module docs). On an
    /// error the journal holds a prefix of what was staged (whole batches), and this journal
    /// must not be used again.
    pub async fn commit(&mut self) -> Result<(), JournalError> {
        let staged = std::mem::take(&mut self.staged);
        if staged.is_empty() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        for batch in staged.chunks(ATOMIC_BATCH_MAX) {
            let messages = batch
                .iter()
                .enumerate()
                .map(|(i, envelope)| {
                    let message = PublishMessage::build()
                        .message_id(envelope.id.to_string())
                        .payload(Bytes::from(envelope.to_json()));
                    match i {
                        0 => message.expected_last_subject_sequence(self.last),
                        _ => message,
                    }
                })
                .collect();
            match self.publisher.publish_atomic(&self.subject, messages).await {
                Ok(p) => self.last = p.sequence,
                Err(PublishError::Conflict { .. }) => return Err(self.deposed().await),
                Err(e) => {
                    return Err(JournalError::Bus {
                        pool: self.pool.clone(),
                        why: e.to_string(),
                    });
                }
            }
        }
        crate::metrics::committed(&self.pool, staged.len(), started.elapsed());
        Ok(())
    }
}

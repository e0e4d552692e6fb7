//! What [`Fgd`](super::Fgd) has worked out of node states, remembered across placements.
//!
//! FGD weighs a placement by the popularity-weighted usable capacity of its node before and
//! after it ([`Fgd::usable_by`](super::Fgd::usable_by)): a sum over every task shape seen so
//! far, asked of every feasible node state, every time a task is placed. On a full cluster the
//! same states come up again and again (on openb, 87% of the questions repeat a state asked
//! before), but the answer changes as the policy learns: each submitted task adds one to its
//! shape's count. Since the sum is over shapes of count × what the shape could use, one more
//! task of a shape adds exactly what that one shape could use, a single term. So each answer
//! is kept with how many of the learnt tasks it counts, and brought up to date when asked
//! again by adding the terms of those learnt since — a few terms instead of every shape's.
//! Answers too far behind (or older than the tasks still listed) are worked out afresh, and
//! the whole memo is forgotten once it holds [`CAPACITY`] states: it is bounded, and every
//! answer is the one [`Fgd::usable_by`](super::Fgd::usable_by) gives, in exact integers.

use std::collections::VecDeque;

use rustc_hash::FxHashMap as HashMap;

use super::{Measure, Row};

/// The most states remembered: 57 bytes each in a table at most half full, so under 4 MiB.
/// On openb, remembering eight times as many is no faster, an eighth as many a little slower.
const CAPACITY: usize = 1 << 15;

/// How many learnt tasks an answer may be behind and still be brought up to date (a term is
/// one shape's part of a fresh answer, which sums over every shape: 126 on openb). On openb,
/// 8 is slower by a sixth; 128 is no faster.
const MOST_BEHIND: u64 = 32;

/// The GPUs a remembered state may have (larger nodes are answered afresh every time).
const GPUS: usize = 8;

/// Which shapes a state was weighed against: those accepting any model, or those a model's
/// nodes can hold (see [`Fgd::scoped_rows`](super::Fgd::scoped_rows)), by the model's number.
pub(super) type Scope = u32;

/// The shapes that accept any model.
pub(super) const ANY: Scope = 0;

#[derive(Default)]
pub(super) struct Memo {
    /// Per state: its weighted usable capacity, and how many learnt tasks that counts.
    known: HashMap<Key, (u64, u64)>,
    /// The tasks learnt lately, in order: each one's shape and the models it names (empty:
    /// any), which say the scopes it counts in.
    learnt: VecDeque<(Row, Vec<Scope>)>,
    /// How many tasks were learnt before the first of `learnt`.
    first: u64,
}

/// A node state as FGD weighs it: the shapes it is weighed against, its free CPU and memory
/// and its GPUs' free shares, largest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    scope: Scope,
    gpus: u8,
    cpu: u64,
    memory: u64,
    free: [u16; GPUS],
}

impl Memo {
    /// One more task of the shape `row` was learnt (its count is not read); it names the
    /// models `scopes` (empty: any).
    pub fn learnt(&mut self, row: Row, scopes: Vec<Scope>) {
        self.learnt.push_back((row, scopes));
        // Only the latest are ever added on: an answer further behind is worked out afresh.
        while self.learnt.len() as u64 > MOST_BEHIND {
            self.learnt.pop_front();
            self.first += 1;
        }
    }

    /// The weighted usable capacity of a node state of `scope` whose GPUs have `free` free
    /// (largest first), with `cpu` and `memory` free; `fresh` works it out afresh.
    #[inline]
    pub fn usable(
        &mut self,
        measure: Measure,
        scope: Scope,
        free: &[u32],
        cpu: u64,
        memory: u64,
        fresh: impl FnOnce() -> u64,
    ) -> u64 {
        if free.len() > GPUS {
            return fresh();
        }
        let mut key = Key {
            scope,
            gpus: free.len() as u8,
            cpu,
            memory,
            free: [0; GPUS],
        };
        for (to, from) in key.free.iter_mut().zip(free) {
            // A GPU's free share is at most a whole GPU, 1,000 milli-GPU.
            *to = *from as u16;
        }
        let now = self.first + self.learnt.len() as u64;
        if let Some((usable, counted)) = self.known.get_mut(&key)
            && *counted >= self.first
        {
            for (row, scopes) in self.learnt.range((*counted - self.first) as usize..) {
                if applies(scopes, scope) {
                    *usable += term(measure, row, free, cpu, memory);
                }
            }
            *counted = now;
            return *usable;
        }
        let usable = fresh();
        if self.known.len() >= CAPACITY {
            self.known.clear();
        }
        self.known.insert(key, (usable, now));
        usable
    }
}

/// Whether a task of a shape naming the models `scopes` (empty: any) counts in `scope` (a
/// model's number is never [`ANY`]).
fn applies(scopes: &[Scope], scope: Scope) -> bool {
    scopes.is_empty() || scopes.contains(&scope)
}

/// What the shape `row` could use, once, on a node whose GPUs have `free` free (largest
/// first) and that has `cpu` and `memory` free: one term of
/// [`Fgd::usable_by`](super::Fgd::usable_by)'s sum, without its count.
pub(super) fn term(measure: Measure, row: &Row, free: &[u32], cpu: u64, memory: u64) -> u64 {
    let holding = free.iter().take_while(|f| **f >= row.gpu_milli).count();
    if holding == 0 || row.gpus as usize > holding || row.cpu_milli > cpu || row.memory_mib > memory
    {
        return 0;
    }
    let usable = free[..holding].iter().map(|f| u64::from(*f)).sum();
    measure.cap(row, usable, cpu, memory)
}

impl Clone for Memo {
    /// A copy of the policy starts remembering afresh: the memo is a cache, and copying it
    /// whole would cost more than it saves.
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl std::fmt::Debug for Memo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memo")
            .field("known", &self.known.len())
            .field("learnt", &(self.first + self.learnt.len() as u64))
            .finish()
    }
}

//! The dependency graph of a workload's tasks (petgraph): cycles, and the facts the scheduler
//! weighs (how many tasks each one unblocks, how long the chain behind it is).
//!
//! Edges run from a dependency to the task that waits for it (`prep -> train` for
//! `train.after: [prep]`), so paths read in the order tasks run.

use std::collections::{BTreeMap, HashMap, VecDeque};

use petgraph::Direction;
use petgraph::algo::{has_path_connecting, tarjan_scc, toposort};
use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::Dfs;

use allot_events::workload::Workload;
use allot_sched::model::DagFacts;

/// A workload's tasks and their dependencies. Built from any spec: duplicate names keep their
/// first task (and only its dependencies), dependencies on unknown tasks are left out (validation reports both).
#[derive(Debug, Clone)]
pub struct Dag {
    graph: DiGraph<String, ()>,
    index: HashMap<String, NodeIndex>,
}

impl Dag {
    /// The graph of `workload`'s tasks.
    pub fn of(workload: &Workload) -> Self {
        let mut graph = DiGraph::new();
        let mut index: HashMap<&str, NodeIndex> = HashMap::new();
        for task in &workload.spec.tasks {
            if !index.contains_key(task.name.as_str()) {
                index.insert(&task.name, graph.add_node(task.name.clone()));
            }
        }
        let mut seen = std::collections::HashSet::new();
        for task in &workload.spec.tasks {
            if !seen.insert(task.name.as_str()) {
                continue;
            }
            let to = index[task.name.as_str()];
            for dep in &task.after {
                if let Some(&from) = index.get(dep.as_str())
                    && graph.find_edge(from, to).is_none()
                {
                    graph.add_edge(from, to, ());
                }
            }
        }
        let index = index.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        Self { graph, index }
    }

    /// Whether `task` waits for `on`, directly or through other tasks.
    pub fn waits_for(&self, task: &str, on: &str) -> bool {
        match (self.index.get(task), self.index.get(on)) {
            (Some(&t), Some(&o)) if t != o => has_path_connecting(&self.graph, o, t, None),
            _ => false,
        }
    }

    /// Every dependency cycle, one per group of tasks that wait for each other, each as the
    /// task names along it from the first-declared task back to it (`[a, b, c, a]`).
    pub fn cycles(&self) -> Vec<Vec<String>> {
        let mut cycles: Vec<Vec<String>> = tarjan_scc(&self.graph)
            .into_iter()
            .filter(|scc| scc.len() > 1 || self.graph.contains_edge(scc[0], scc[0]))
            .map(|scc| self.cycle_through(&scc))
            .collect();
        cycles.sort();
        cycles
    }

    /// The shortest cycle through the first-declared task of a strongly connected group.
    fn cycle_through(&self, scc: &[NodeIndex]) -> Vec<String> {
        let start = *scc.iter().min().expect("a component has a node");
        let mut parent: HashMap<NodeIndex, NodeIndex> = HashMap::new();
        let mut queue = VecDeque::from([start]);
        let mut last = start;
        'search: while let Some(at) = queue.pop_front() {
            // In declaration order, so the cycle shown is the one a reader finds first.
            let mut nexts: Vec<NodeIndex> = self
                .graph
                .neighbors_directed(at, Direction::Outgoing)
                .collect();
            nexts.sort();
            for next in nexts {
                if next == start {
                    last = at;
                    break 'search;
                }
                if scc.contains(&next) && !parent.contains_key(&next) {
                    parent.insert(next, at);
                    queue.push_back(next);
                }
            }
        }
        let mut path = vec![start];
        let mut at = last;
        while at != start {
            path.push(at);
            at = parent[&at];
        }
        path[1..].reverse();
        path.push(start);
        path.into_iter().map(|n| self.graph[n].clone()).collect()
    }

    /// Each task's [`DagFacts`]: how many tasks wait for it directly or not, and the length of
    /// the longest chain from it to the end of the workload (1: nothing follows it).
    ///
    /// `None` if the graph has a cycle (validation rejects such specs first).
    pub fn facts(&self) -> Option<BTreeMap<String, DagFacts>> {
        let order = toposort(&self.graph, None).ok()?;
        let mut rank: HashMap<NodeIndex, u32> = HashMap::new();
        for &node in order.iter().rev() {
            let longest_after = self
                .graph
                .neighbors_directed(node, Direction::Outgoing)
                .map(|n| rank[&n])
                .max()
                .unwrap_or(0);
            rank.insert(node, longest_after + 1);
        }
        let mut facts = BTreeMap::new();
        for node in self.graph.node_indices() {
            let mut dfs = Dfs::new(&self.graph, node);
            let mut reachable = 0u32;
            while dfs.next(&self.graph).is_some() {
                reachable += 1;
            }
            facts.insert(
                self.graph[node].clone(),
                DagFacts {
                    dependents: reachable - 1,
                    critical_path_rank: rank[&node],
                },
            );
        }
        Some(facts)
    }

    /// The longest chain of tasks in the workload (0 for none, `None` with a cycle).
    pub fn depth(&self) -> Option<u32> {
        Some(
            self.facts()?
                .values()
                .map(|f| f.critical_path_rank)
                .max()
                .unwrap_or(0),
        )
    }
}

#[cfg(test)]
mod tests;

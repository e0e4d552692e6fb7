//! The cluster's node shapes: what the largest request could ever be given.
//!
//! From `--cluster 4x8:H100,2x4:L4` offline, or from the inventory's answer on
//! `allot.query.inventory.status` (the CLI converts it). Unknown figures are 0 and not checked.

use std::collections::BTreeMap;

/// Nodes of one shape.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeShape {
    /// How many nodes have this shape.
    pub count: u32,
    /// GPUs per node.
    pub gpus: u32,
    /// Their model (empty: unknown, which any model constraint accepts).
    pub gpu_model: String,
    /// Memory of each GPU, MiB (0: unknown).
    pub gpu_memory_mib: u64,
    /// Allocatable CPU per node, millicores (0: unknown).
    pub cpu_milli: u64,
    /// Allocatable memory per node, MiB (0: unknown).
    pub memory_mib: u64,
    /// MIG instances per node by profile; `None`: unknown (MIG requests are not checked).
    pub mig: Option<BTreeMap<String, u32>>,
}

impl NodeShape {
    /// `4x8:H100` (`8 GPUs` for an unknown model, `CPU only` without GPUs).
    pub fn describe(&self) -> String {
        let mut out = format!("{}x{}", self.count, self.gpus);
        if !self.gpu_model.is_empty() {
            out.push(':');
            out.push_str(&self.gpu_model);
        }
        out
    }
}

impl From<&allot_events::node::NodeRegistered> for NodeShape {
    /// One node as its collector registered it (as the allocator reads it: the first GPU's
    /// model, the smallest GPU memory).
    fn from(r: &allot_events::node::NodeRegistered) -> Self {
        NodeShape {
            count: 1,
            gpus: r.gpus.len() as u32,
            gpu_model: r.gpus.first().map(|g| g.model.clone()).unwrap_or_default(),
            gpu_memory_mib: r.gpus.iter().map(|g| g.memory_total_mib).min().unwrap_or(0),
            cpu_milli: r.cpu_milli,
            memory_mib: r.memory_mib,
            mig: None,
        }
    }
}

/// Every node shape of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterShape {
    /// The shapes, in the order given.
    pub nodes: Vec<NodeShape>,
}

/// A `--cluster` value that is not `NODESxGPUS[:MODEL]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--cluster {0:?}: use NODESxGPUS[:MODEL][,…], e.g. 4x8:H100 or 4x8:H100,2x4:L4")]
pub struct InvalidCluster(pub String);

impl ClusterShape {
    /// `4x8:H100,2x4:L4`: nodes × GPUs per node, and the model (GPU memory, CPU and memory
    /// unknown until the caller fills them in).
    pub fn parse(spec: &str) -> Result<Self, InvalidCluster> {
        let mut nodes = Vec::new();
        for part in spec.split(',').map(str::trim) {
            let (shape, model) = part.split_once(':').unwrap_or((part, ""));
            let parsed = shape
                .split_once('x')
                .and_then(|(n, g)| Some((n.parse::<u32>().ok()?, g.parse::<u32>().ok()?)));
            match parsed {
                Some((count, gpus)) if count > 0 => nodes.push(NodeShape {
                    count,
                    gpus,
                    gpu_model: model.to_owned(),
                    ..NodeShape::default()
                }),
                _ => return Err(InvalidCluster(spec.to_owned())),
            }
        }
        Ok(Self { nodes })
    }

    /// `4x8:H100, 2x4:L4`.
    pub fn describe(&self) -> String {
        self.nodes
            .iter()
            .map(NodeShape::describe)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Adds one node, merging it into an existing shape when equal.
    pub fn add(&mut self, node: NodeShape) {
        match self.nodes.iter_mut().find(|n| {
            NodeShape {
                count: n.count,
                ..node.clone()
            } == **n
        }) {
            Some(same) => same.count += node.count,
            None => self.nodes.push(node),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_flags_name_nodes_gpus_and_models() {
        let c = ClusterShape::parse("4x8:H100, 2x4:L4,1x0").unwrap();
        assert_eq!(c.describe(), "4x8:H100, 2x4:L4, 1x0");
        assert_eq!(c.nodes[0].gpus, 8);
        for bad in ["", "4", "x8", "0x8", "4x8:H100,,"] {
            assert!(ClusterShape::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn equal_nodes_merge_into_one_shape() {
        let mut c = ClusterShape::default();
        for _ in 0..3 {
            c.add(NodeShape {
                count: 1,
                gpus: 8,
                gpu_model: "H100".into(),
                ..NodeShape::default()
            });
        }
        assert_eq!(c.describe(), "3x8:H100");
    }
}

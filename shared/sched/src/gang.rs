//! Gang placement: every member of a gang is placed, or none is — and as close together as the
//! cluster allows: on one node if they fit there, else within one NVLink domain, else within one
//! rack, else anywhere in the pool ([`Level`]).
//!
//! At each level the groups (nodes, domains, racks) with enough free milli-GPU for the whole
//! gang are tried tightest first (fewest free, then lowest node index), at most
//! [`GROUPS_TRIED`] per level. Within a group the members are placed largest first by best fit,
//! each taking its resources before the next is placed; if one does not fit, everything taken
//! is given back and the next group is tried. The cluster is left exactly as it was.

use std::collections::BTreeMap;

use crate::cluster::{Cluster, Placement};
use crate::model::{NodeIdx, TaskSpec};
use crate::placement::{self, Level};

/// Groups tried per topology level before moving on to the next (looser) level.
pub const GROUPS_TRIED: usize = 16;

/// A placement for every member (in the order given) and the tightest level they fit within,
/// or `None` if the gang does not fit now.
pub fn place(cluster: &mut Cluster, members: &[&TaskSpec]) -> Option<(Vec<Placement>, Level)> {
    // MIG members take instances, not the GPU capacity groups are sized by.
    let demand: u64 = members
        .iter()
        .filter(|m| m.mig_profile.is_none())
        .map(|m| m.gpu_demand_milli())
        .sum();
    // Largest first: the hardest to fit decide whether the group will do.
    let mut order: Vec<usize> = (0..members.len()).collect();
    order.sort_by_key(|i| std::cmp::Reverse(members[*i].gpu_demand_milli()));
    for level in Level::ALL {
        for group in groups(cluster, level, demand) {
            let inside = |idx: NodeIdx| group.get(idx.0 as usize).copied().unwrap_or(false);
            if let Some(placements) = place_all(cluster, members, &order, &inside) {
                return Some((placements, level));
            }
        }
    }
    None
}

/// The groups of `level` with at least `demand` milli-GPU free on schedulable nodes, tightest
/// first, as membership masks over node indices.
fn groups(cluster: &Cluster, level: Level, demand: u64) -> Vec<Vec<bool>> {
    let mut free: BTreeMap<&str, (u64, NodeIdx, Vec<NodeIdx>)> = BTreeMap::new();
    for (i, node) in cluster.nodes().iter().enumerate() {
        if !node.schedulable {
            continue;
        }
        let Some(key) = level.key(node) else { continue };
        let idx = NodeIdx(i as u32);
        let entry = free.entry(key).or_insert((0, idx, Vec::new()));
        entry.0 += node.gpu_free.iter().map(|f| u64::from(*f)).sum::<u64>();
        entry.2.push(idx);
    }
    let mut fit: Vec<(u64, NodeIdx, Vec<NodeIdx>)> = free
        .into_values()
        .filter(|(f, _, _)| *f >= demand)
        .collect();
    fit.sort_by_key(|(f, first, _)| (*f, *first));
    fit.truncate(GROUPS_TRIED);
    let n = cluster.nodes().len();
    fit.into_iter()
        .map(|(_, _, nodes)| {
            let mut mask = vec![false; n];
            for idx in nodes {
                mask[idx.0 as usize] = true;
            }
            mask
        })
        .collect()
}

/// Places every member within the group, or none; leaves the cluster as it was.
fn place_all(
    cluster: &mut Cluster,
    members: &[&TaskSpec],
    order: &[usize],
    inside: &dyn Fn(NodeIdx) -> bool,
) -> Option<Vec<Placement>> {
    let mut placed: Vec<Option<Placement>> = vec![None; members.len()];
    let mut ok = true;
    for &i in order {
        match placement::best_fit_within(cluster, members[i], inside) {
            Some(p) => {
                cluster.allocate(&p);
                placed[i] = Some(p);
            }
            None => {
                ok = false;
                break;
            }
        }
    }
    for p in placed.iter().flatten() {
        cluster.release(p);
    }
    if ok {
        placed.into_iter().collect()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NodeSpec;

    fn cluster(nodes: &[(&str, u32, &str, &str)]) -> Cluster {
        let mut c = Cluster::new();
        for (name, gpus, rack, domain) in nodes {
            c.add_node(NodeSpec::new(*name, *gpus, "A100").in_topology(*rack, *domain));
        }
        c
    }

    fn names(c: &Cluster, placements: &[Placement]) -> Vec<String> {
        placements
            .iter()
            .flat_map(|p| &p.shares)
            .map(|s| c.node(s.node).spec.name.clone())
            .collect()
    }

    #[test]
    fn a_gang_goes_to_the_tightest_topology_level_it_fits() {
        struct Case {
            name: &'static str,
            /// (node, GPUs busy) before the gang arrives.
            busy: &'static [(usize, u32)],
            members: u32,
            gpus_each: u32,
            want_level: Level,
            want_nodes: &'static [&'static str],
        }
        // r1 = {d1: n0 n1, d2: n2}; r2 = {d3: n3 n4}; 4 GPUs each.
        let layout = [
            ("n0", 4, "r1", "d1"),
            ("n1", 4, "r1", "d1"),
            ("n2", 4, "r1", "d2"),
            ("n3", 4, "r2", "d3"),
            ("n4", 4, "r2", "d3"),
        ];
        let cases = [
            Case {
                name: "fits on one node: the fullest that holds it",
                busy: &[(3, 1)],
                members: 3,
                gpus_each: 1,
                want_level: Level::Node,
                want_nodes: &["n3", "n3", "n3"],
            },
            Case {
                name: "a free node beats spreading over a domain",
                busy: &[(0, 2), (1, 2), (2, 3)],
                members: 2,
                gpus_each: 2,
                want_level: Level::Node,
                want_nodes: &["n3", "n3"],
            },
            Case {
                name: "one domain when no node has room",
                busy: &[(0, 2), (1, 2), (3, 3), (4, 3), (2, 3)],
                members: 2,
                gpus_each: 2,
                want_level: Level::NvlinkDomain,
                want_nodes: &["n0", "n1"],
            },
            Case {
                name: "one rack when no domain has room",
                busy: &[(0, 3), (1, 3), (2, 2), (3, 3), (4, 3)],
                members: 4,
                gpus_each: 1,
                want_level: Level::Rack,
                want_nodes: &["n0", "n1", "n2", "n2"],
            },
        ];
        for case in cases {
            let mut c = cluster(&layout);
            for (node, gpus) in case.busy {
                let spec = TaskSpec::new(99, "x", *gpus);
                let p = placement::best_fit_within(&c, &spec, &|i| i.0 as usize == *node)
                    .expect("busy fits");
                c.allocate(&p);
            }
            let before = c.allocated_milli();
            let specs: Vec<TaskSpec> = (0..case.members)
                .map(|i| TaskSpec::new(u64::from(i), "t", case.gpus_each))
                .collect();
            let refs: Vec<&TaskSpec> = specs.iter().collect();
            let (placements, level) = place(&mut c, &refs).expect(case.name);
            assert_eq!(level, case.want_level, "{}", case.name);
            let mut got = names(&c, &placements);
            got.sort();
            let mut want: Vec<String> = case.want_nodes.iter().map(|s| s.to_string()).collect();
            want.sort();
            assert_eq!(got, want, "{}", case.name);
            assert_eq!(
                c.allocated_milli(),
                before,
                "{}: cluster left as it was",
                case.name
            );
        }
    }

    #[test]
    fn a_gang_that_does_not_fit_whole_takes_nothing() {
        let mut c = cluster(&[("n0", 4, "", ""), ("n1", 4, "", "")]);
        let specs: Vec<TaskSpec> = (0..3).map(|i| TaskSpec::new(i, "t", 3)).collect();
        let refs: Vec<&TaskSpec> = specs.iter().collect();
        assert!(place(&mut c, &refs).is_none());
        assert_eq!(c.allocated_milli(), 0);
    }
}

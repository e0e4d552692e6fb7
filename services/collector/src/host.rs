//! The machine the collector runs on: its host name and its CPU and memory capacity.

/// Allocatable CPU and memory of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostCapacity {
    /// CPU in millicores.
    pub cpu_milli: u64,
    /// Memory in MiB.
    pub memory_mib: u64,
}

/// This machine's CPU (available parallelism × 1000) and memory (`MemTotal` in
/// `/proc/meminfo`). A value that cannot be read is reported as 0 and logged, so the node
/// still registers and the operator sees why its capacity is missing.
pub fn local_capacity() -> HostCapacity {
    let cpu_milli = match std::thread::available_parallelism() {
        Ok(n) => n.get() as u64 * 1000,
        Err(e) => {
            tracing::warn!(error = %e, "cannot count this machine's CPUs; reporting 0 millicores");
            0
        }
    };
    let memory_mib = match std::fs::read_to_string("/proc/meminfo") {
        Ok(text) => mem_total_mib(&text).unwrap_or_else(|| {
            tracing::warn!("/proc/meminfo has no MemTotal line; reporting 0 MiB of memory");
            0
        }),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read /proc/meminfo; reporting 0 MiB of memory");
            0
        }
    };
    HostCapacity {
        cpu_milli,
        memory_mib,
    }
}

/// `MemTotal` from the text of `/proc/meminfo` (given in kB), in MiB.
fn mem_total_mib(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let rest = line.strip_prefix("MemTotal:")?;
        let mut parts = rest.split_whitespace();
        let kib: u64 = parts.next()?.parse().ok()?;
        match parts.next() {
            Some("kB") | None => Some(kib / 1024),
            Some(_) => None,
        }
    })
}

pub use allot_events::node::hostname;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_total_is_read_in_mib_from_meminfo() {
        for (name, text, want) in [
            (
                "a typical meminfo",
                "MemTotal:       65843784 kB\nMemFree:         1234 kB\n",
                Some(64_300),
            ),
            (
                "MemTotal not first",
                "MemFree: 1 kB\nMemTotal: 2048 kB\n",
                Some(2),
            ),
            ("no MemTotal", "MemFree: 1 kB\n", None),
            ("garbage value", "MemTotal: lots kB\n", None),
            ("unexpected unit", "MemTotal: 5 MB\n", None),
        ] {
            assert_eq!(mem_total_mib(text), want, "{name}");
        }
    }

    #[test]
    fn this_machine_reports_some_capacity_and_a_name() {
        let capacity = local_capacity();
        assert!(capacity.cpu_milli >= 1000, "{capacity:?}");
        assert!(!hostname().is_empty());
    }
}

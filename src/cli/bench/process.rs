//! Services the benchmarks start as child processes (`allot run <service>`), so that each one's
//! CPU and memory are its own, and what `/proc` says about a process.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;

/// One `allot run <service>` child, its output in `<data dir>/<name>.log`.
#[derive(Debug)]
pub struct Child {
    /// What the benchmark calls it (the service, or the service and its instance).
    pub name: String,
    pub child: tokio::process::Child,
    pub pid: u32,
    pub log: PathBuf,
}

impl Child {
    /// Starts `allot run <args…>` against `url`, in `data_dir` (created), with `env` added to
    /// the variables every benchmark sets: the URL, quiet NATS logs and no ops port.
    pub fn start(
        name: &str,
        args: &[OsString],
        env: &[(&str, OsString)],
        url: &str,
        data_dir: &Path,
    ) -> anyhow::Result<Child> {
        std::fs::create_dir_all(data_dir)?;
        let log = data_dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log)?;
        let mut command = tokio::process::Command::new(std::env::current_exe()?);
        command
            .arg("run")
            .args(args)
            .env("ALLOT_NATS_URL", url)
            .env("ALLOT_LOG", "info,async_nats=warn")
            .env("ALLOT_OPS_ADDR", "off")
            .current_dir(data_dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true);
        for (key, value) in env {
            command.env(key, value);
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting allot run {name}"))?;
        let pid = child.id().context("the service exited at once")?;
        eprintln!("{name}: pid {pid}, log {}", log.display());
        Ok(Child {
            name: name.to_owned(),
            child,
            pid,
            log,
        })
    }

    /// An error naming the service, its exit status and its log, if it has exited.
    pub fn exited(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            anyhow::bail!(
                "{} exited ({status}): {}",
                self.name,
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
        Ok(())
    }

    /// CPU seconds used so far.
    pub fn cpu_s(&self) -> f64 {
        cpu_or_nan(self.pid)
    }

    /// Resident memory now and at its peak, MiB.
    pub fn memory_mib(&self) -> (f64, f64) {
        memory_mib(self.pid)
    }

    /// Stops it as its orchestrator would (SIGTERM, SIGKILL after 10 s).
    pub async fn stop(&mut self) {
        terminate(self.pid);
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// Asks process `pid` (our child) to stop. A graceful stop lets a service finish its batch
/// and close its database, which is read afterwards; std has no safe way to send SIGTERM.
#[allow(unsafe_code)]
fn terminate(pid: u32) {
    // SAFETY: kill(2) on our own child's pid touches no memory of ours.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGTERM);
    }
}

/// User + system CPU seconds of process `pid` (all its threads), from `/proc/<pid>/stat`.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    cpu_ticks(&stat).map(|t| t as f64 / USER_HZ)
}

/// [`cpu_seconds`], NaN where it cannot be read.
pub fn cpu_or_nan(pid: u32) -> f64 {
    cpu_seconds(pid).unwrap_or(f64::NAN)
}

/// This process's [`cpu_seconds`].
pub fn own_cpu() -> f64 {
    cpu_or_nan(std::process::id())
}

/// Resident memory of process `pid` now and at its peak (`VmRSS`, `VmHWM`), MiB; NaN where
/// they cannot be read.
pub fn memory_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let mib = |key| status_kib(&status, key).map_or(f64::NAN, |k| k as f64 / 1024.0);
    (mib("VmRSS"), mib("VmHWM"))
}

/// The unit of `/proc/<pid>/stat`'s times: Linux reports them in USER_HZ, which is 100 on
/// every architecture Allot runs on (`getconf CLK_TCK`).
const USER_HZ: f64 = 100.0;

/// utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` line, in clock ticks. The
/// command name (field 2) may hold spaces and parentheses, so fields count from its last `)`.
pub fn cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// A `kB` figure of `/proc/<pid>/status` (`VmRSS`, `VmHWM` …).
pub fn status_kib(status: &str, key: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let value = line.strip_prefix(key)?.strip_prefix(':')?;
        value.split_whitespace().next()?.parse().ok()
    })
}

/// Bytes process `pid` has passed to write(2) and its kin (`wchar` of `/proc/<pid>/io`):
/// its database and WAL writes, its log, and its few bytes to NATS.
pub fn written_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .ok()
        .and_then(|io| {
            io.lines()
                .find_map(|l| l.strip_prefix("wchar:")?.trim().parse().ok())
        })
        .unwrap_or(0)
}

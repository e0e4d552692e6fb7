//! [`NatsServer`]: one real, JetStream-enabled `nats-server` process for one test.

use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::binary::nats_server_binary;
use crate::net::{self, HOST};

/// How long a server may take from spawn until it accepts clients.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`NatsServer::stop`] waits after SIGTERM before it sends SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How often a fresh set of random ports is tried when another process took one first.
pub(crate) const PORT_ATTEMPTS: usize = 5;
const POLL_INTERVAL: Duration = Duration::from_millis(25);

/// A real `nats-server` with JetStream for one test.
///
/// It listens on a random free port on 127.0.0.1 (plus a monitoring port), keeps its config,
/// log and JetStream store in a temporary directory, and is killed with SIGKILL and reaped when
/// dropped, so no process outlives the test that started it (unless the test process itself is
/// killed before it can unwind).
///
/// All methods block and need no async runtime, so they work from `#[test]` and
/// `#[tokio::test]` alike.
#[derive(Debug)]
pub struct NatsServer {
    binary: PathBuf,
    config: Config,
    config_path: PathBuf,
    log_path: PathBuf,
    child: Option<Child>,
    pid: u32,
    /// Where the output of the current process starts in the log file.
    run_log_offset: usize,
    /// Held for its `Drop`, which removes the store, config and log after the process is gone.
    dir: TempDir,
}

impl NatsServer {
    /// Starts a server and waits until it accepts clients.
    ///
    /// # Panics
    ///
    /// If no `nats-server` binary is found (with [`MissingNatsServer`]'s message), or if the
    /// server does not accept clients within 10 s (with the server's log).
    ///
    /// [`MissingNatsServer`]: crate::MissingNatsServer
    pub fn start() -> NatsServer {
        NatsServer::start_with_config("")
    }

    /// Like [`NatsServer::start`], with `extra_config` (raw nats-server config text, such as an
    /// `accounts { .. }` block) appended to the generated config file.
    pub fn start_with_config(extra_config: &str) -> NatsServer {
        let binary = nats_server_binary().unwrap_or_else(|missing| panic!("{missing}"));
        let [port, monitor_port] = pick_ports();
        let mut server = NatsServer::prepare(
            binary,
            Config {
                server_name: "allot-test".to_owned(),
                port,
                monitor_port,
                store_dir: PathBuf::new(),
                cluster: None,
                extra: extra_config.to_owned(),
            },
        );
        for attempt in 1..=PORT_ATTEMPTS {
            server.spawn();
            match server.wait_ready(Instant::now() + READY_TIMEOUT) {
                Ok(()) => return server,
                Err(NotReady::PortInUse) if attempt < PORT_ATTEMPTS => {
                    tracing::debug!(port = server.port(), "nats-server port was taken, retrying");
                    server.kill();
                    [server.config.port, server.config.monitor_port] = pick_ports();
                    server.write_config();
                }
                Err(not_ready) => panic!("{}", server.failure(&not_ready)),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// The client URL, `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://{HOST}:{}", self.config.port)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.config.port
    }

    /// The HTTP monitoring port (`/varz`, `/jsz`, `/healthz`, ...).
    pub fn monitor_port(&self) -> u16 {
        self.config.monitor_port
    }

    /// The server's name (`server_name` in its config).
    pub fn server_name(&self) -> &str {
        &self.config.server_name
    }

    /// The JetStream `store_dir`; it survives [`NatsServer::restart`].
    pub fn store_dir(&self) -> &Path {
        &self.config.store_dir
    }

    /// The process id of the most recently started `nats-server` process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Kills the server with SIGKILL and starts it again on the same port with the same store,
    /// so JetStream data survives; waits until it accepts clients.
    ///
    /// # Panics
    ///
    /// If the server does not accept clients within 10 s (with its log).
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.spawn();
            match self.wait_ready(deadline) {
                Ok(()) => return,
                // The port is pinned; something (another test, our old socket) may hold it for
                // a moment, so try again rather than move.
                Err(NotReady::PortInUse) if Instant::now() < deadline => {
                    self.kill();
                    thread::sleep(Duration::from_millis(200));
                }
                Err(not_ready) => panic!("{}", self.failure(&not_ready)),
            }
        }
    }

    /// Stops the server gracefully: SIGTERM, then SIGKILL if it has not exited within 5 s.
    /// Does nothing if it is not running.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let signalled = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if signalled {
            let deadline = Instant::now() + STOP_GRACE;
            while Instant::now() < deadline {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    return;
                }
                thread::sleep(POLL_INTERVAL);
            }
            tracing::warn!(
                pid = child.id(),
                "nats-server ignored SIGTERM for 5 s; killing it"
            );
        }
        kill_and_reap(child);
    }

    /// Kills the server with SIGKILL now and reaps it. Does nothing if it is not running.
    pub fn kill(&mut self) {
        if let Some(child) = self.child.take() {
            kill_and_reap(child);
        }
    }

    /// Everything the server has logged so far, across restarts (each start is marked with a
    /// `=== allot-testkit: ...` line).
    pub fn log(&self) -> String {
        fs::read(&self.log_path)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default()
    }

    /// A server in its own temporary directory with its config written, not yet running.
    pub(crate) fn prepare(binary: PathBuf, mut config: Config) -> NatsServer {
        let dir = tempfile::Builder::new()
            .prefix("allot-nats-")
            .tempdir()
            .expect("create a temporary directory for nats-server");
        config.store_dir = dir.path().join("jetstream");
        let server = NatsServer {
            binary,
            config,
            config_path: dir.path().join("nats-server.conf"),
            log_path: dir.path().join("nats-server.log"),
            child: None,
            pid: 0,
            run_log_offset: 0,
            dir,
        };
        server.write_config();
        server
    }

    fn write_config(&self) {
        fs::write(&self.config_path, self.config.render()).expect("write nats-server config");
    }

    /// Starts the process (without waiting), its stdout and stderr appended to the log file.
    pub(crate) fn spawn(&mut self) {
        assert!(self.child.is_none(), "nats-server is already running");
        let mut log = File::options()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .expect("open nats-server log file");
        writeln!(
            log,
            "=== allot-testkit: {} -c {} ===",
            self.binary.display(),
            self.config_path.display()
        )
        .expect("write nats-server log file");
        self.run_log_offset = self.log().len();

        let stderr = log.try_clone().expect("clone nats-server log file");
        let child = Command::new(&self.binary)
            .arg("-c")
            .arg(&self.config_path)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|err| panic!("spawn {}: {err}", self.binary.display()));
        self.pid = child.id();
        tracing::debug!(
            pid = self.pid,
            port = self.config.port,
            "nats-server started"
        );
        self.child = Some(child);
    }

    /// Waits until the running process accepts clients, or exits, or `deadline` passes.
    pub(crate) fn wait_ready(&mut self, deadline: Instant) -> Result<(), NotReady> {
        loop {
            let Some(child) = self.child.as_mut() else {
                return Err(NotReady::NotRunning);
            };
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Err(if self.run_log().contains("address already in use") {
                    NotReady::PortInUse
                } else {
                    NotReady::Exited(status)
                });
            }
            if net::accepts_clients(self.config.port) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(NotReady::TimedOut);
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// The log of the current (or last) process only.
    fn run_log(&self) -> String {
        let log = self.log();
        log.get(self.run_log_offset..).unwrap_or(&log).to_owned()
    }

    /// A panic message for a server that did not come up: why, its config, and its log.
    pub(crate) fn failure(&self, reason: &dyn std::fmt::Display) -> String {
        let mut message = format!(
            "nats-server {} on {HOST}:{} did not come up: {reason}\nbinary: {}\nconfig {}:\n",
            self.config.server_name,
            self.config.port,
            self.binary.display(),
            self.config_path.display(),
        );
        message.push_str(&self.config.render());
        let _ = write!(
            message,
            "\nlog {}:\n{}",
            self.log_path.display(),
            self.log()
        );
        message
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn kill_and_reap(mut child: Child) {
    // Errors mean it has exited already; `wait` still reaps it so no zombie is left.
    let _ = child.kill();
    let _ = child.wait();
}

fn pick_ports() -> [u16; 2] {
    let ports = net::free_ports(2);
    [ports[0], ports[1]]
}

/// Why a spawned server is not accepting clients.
#[derive(Debug)]
pub(crate) enum NotReady {
    /// It exited because one of its ports was taken by another process.
    PortInUse,
    /// It exited for another reason.
    Exited(ExitStatus),
    /// It is still running but did not accept clients in time.
    TimedOut,
    /// It was not started.
    NotRunning,
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotReady::PortInUse => f.write_str("a port was already in use"),
            NotReady::Exited(status) => write!(f, "it exited ({status})"),
            NotReady::TimedOut => f.write_str("it did not accept clients in time"),
            NotReady::NotRunning => f.write_str("it was not running"),
        }
    }
}

/// What goes into a server's generated config file.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) server_name: String,
    pub(crate) port: u16,
    pub(crate) monitor_port: u16,
    /// Set by [`NatsServer::prepare`] to a directory inside the server's temporary directory.
    pub(crate) store_dir: PathBuf,
    pub(crate) cluster: Option<ClusterConfig>,
    /// Raw config text appended at the end.
    pub(crate) extra: String,
}

/// The `cluster { .. }` block of a clustered server.
#[derive(Debug, Clone)]
pub(crate) struct ClusterConfig {
    pub(crate) name: String,
    pub(crate) port: u16,
    /// Route ports of every node, this one included (nats-server skips routes to itself).
    pub(crate) routes: Vec<u16>,
}

impl Config {
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = writeln!(out, "server_name: {}", quote(&self.server_name));
        let _ = writeln!(out, "listen: \"{HOST}:{}\"", self.port);
        let _ = writeln!(out, "http: \"{HOST}:{}\"", self.monitor_port);
        let _ = writeln!(out, "jetstream {{");
        let _ = writeln!(
            out,
            "  store_dir: {}",
            quote(&self.store_dir.to_string_lossy())
        );
        let _ = writeln!(out, "  max_memory_store: 256MB");
        let _ = writeln!(out, "  max_file_store: 2GB");
        let _ = writeln!(out, "}}");
        if let Some(cluster) = &self.cluster {
            let _ = writeln!(out, "cluster {{");
            let _ = writeln!(out, "  name: {}", quote(&cluster.name));
            let _ = writeln!(out, "  listen: \"{HOST}:{}\"", cluster.port);
            let _ = writeln!(out, "  routes: [");
            for route in &cluster.routes {
                let _ = writeln!(out, "    \"nats-route://{HOST}:{route}\"");
            }
            let _ = writeln!(out, "  ]");
            let _ = writeln!(out, "}}");
        }
        if !self.extra.is_empty() {
            out.push_str(&self.extra);
            out.push('\n');
        }
        out
    }
}

/// A double-quoted nats-server config string.
fn quote(value: &str) -> String {
    format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
}

#[cfg(test)]
mod tests;

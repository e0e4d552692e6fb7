//! The local installation under `./.allot/`: the embedded nats-server `allot up` starts, and
//! how client commands started in the same folder find it.
// One `unsafe` block: asking Linux to kill the nats-server child if we die (PR_SET_PDEATHSIG),
// so even a SIGKILLed `allot up` leaves no server behind. There is no safe std API for it.
#![allow(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

/// The pinned nats-server version the project installs.
pub const NATS_SERVER_VERSION: &str = "2.15.1";

/// Files `allot up` keeps in its data folder.
pub fn url_file(data_dir: &Path) -> PathBuf {
    data_dir.join("nats.url")
}

/// The URL client commands use: `--nats`, then `ALLOT_NATS_URL`, then the `nats.url` written by
/// an `allot up` in this folder — with the `admin` credentials it keeps beside it written in,
/// since its server lets no anonymous client in — then the default port.
///
/// The URL may hold a password: show it with [`allot_bus::users::without_credentials`].
pub fn discover_url(
    flag: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
    data_dir: &Path,
) -> (String, String) {
    if let Some(url) = flag {
        return (url.to_owned(), "--nats".into());
    }
    if let Some(url) = env("ALLOT_NATS_URL") {
        return (url, "ALLOT_NATS_URL".into());
    }
    if let Ok(url) = std::fs::read_to_string(url_file(data_dir)) {
        let url = match super::auth::admin_credentials(data_dir) {
            Some(admin) => {
                allot_bus::users::url_with_credentials(url.trim(), &admin.user, &admin.password)
            }
            None => url.trim().to_owned(),
        };
        return (url, url_file(data_dir).display().to_string());
    }
    ("nats://127.0.0.1:4222".into(), "the default".into())
}

/// Connects a client command (`submit`, `abort` …) as `name` to the NATS server it finds with
/// [`discover_url`] (`data_dir`: `--data-dir`, then `ALLOT_DATA_DIR`, then `.allot`); if it is
/// not reachable, the error says where the URL came from and that `nothing` happened.
pub async fn connect_client(
    name: &str,
    nats: Option<&str>,
    data_dir: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
    nothing: &str,
) -> anyhow::Result<async_nats::Client> {
    let data_dir = data_dir
        .map(str::to_owned)
        .or_else(|| env("ALLOT_DATA_DIR"))
        .unwrap_or_else(|| ".allot".into());
    let (url, origin) = discover_url(nats, env, Path::new(&data_dir));
    allot_bus::connect::with_url_credentials(async_nats::ConnectOptions::new(), &url)
        .name(name)
        .connection_timeout(Duration::from_secs(2))
        .connect(allot_bus::server_list(&url))
        .await
        .with_context(|| {
            format!(
                "NATS at {} (from {origin}) is not reachable; {nothing}. Is `allot up` running \
                 in this folder? (or pass --nats URL)",
                allot_bus::users::without_credentials(&url)
            )
        })
}

/// Finds the nats-server binary: `ALLOT_NATS_SERVER`, the project's `.tools/bin`, then PATH.
pub fn nats_server_binary(env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<PathBuf> {
    let mut tried = Vec::new();
    if let Some(path) = env("ALLOT_NATS_SERVER") {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        tried.push(path.display().to_string());
    }
    let mut roots: Vec<PathBuf> = std::env::current_dir().into_iter().collect();
    if let Ok(exe) = std::env::current_exe() {
        // target/{debug,release}/allot → the checkout root
        roots.extend(exe.ancestors().skip(3).take(1).map(Path::to_path_buf));
    }
    for root in roots {
        let candidate = root.join(".tools/bin/nats-server");
        if candidate.is_file() {
            return Ok(candidate);
        }
        tried.push(candidate.display().to_string());
    }
    if let Some(paths) = env("PATH") {
        for dir in std::env::split_paths(&paths) {
            let candidate = dir.join("nats-server");
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
        tried.push("nats-server on PATH".into());
    }
    bail!(
        "nats-server not found (tried {}). Install the pinned {NATS_SERVER_VERSION} with \
         scripts/install-nats.sh from the project root, or pass --nats URL to use a running server",
        tried.join(", ")
    )
}

/// The embedded nats-server child.
#[derive(Debug)]
pub struct EmbeddedNats {
    child: Child,
    url: String,
    url_file: PathBuf,
}

impl EmbeddedNats {
    /// Writes `nats.url`, through which client commands in this folder find the server: call
    /// it once the streams exist, so a command that finds the file finds a working Allot.
    pub fn announce(&self) -> anyhow::Result<()> {
        std::fs::write(&self.url_file, format!("{}\n", self.url))
            .with_context(|| format!("writing {}", self.url_file.display()))
    }

    /// Starts nats-server with JetStream, its store and log under `data_dir`, on `port`
    /// (0: 4222 if free, else any free port), and waits until it accepts clients. `config` is
    /// a configuration file for what flags cannot say (`allot up`'s users).
    pub async fn start(
        binary: &Path,
        data_dir: &Path,
        port: u16,
        config: Option<&Path>,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("creating {}", data_dir.display()))?;
        let port = if port == 0 { pick_port() } else { port };
        let store = data_dir.join("nats");
        let log = data_dir.join("nats.log");
        let mut command = Command::new(binary);
        command
            .args([
                "--jetstream",
                "--addr",
                "127.0.0.1",
                "--port",
                &port.to_string(),
            ])
            .arg("--store_dir")
            .arg(&store)
            .arg("--log")
            .arg(&log)
            .arg("--server_name")
            .arg("allot-local")
            .args(
                config
                    .into_iter()
                    .flat_map(|c| [std::ffi::OsStr::new("--config"), c.as_os_str()]),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of ours.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let url = format!("nats://127.0.0.1:{port}");
        let mut nats = Self {
            child,
            url: url.clone(),
            url_file: url_file(data_dir),
        };
        nats.wait_ready(port, &log).await?;
        tracing::info!(%url, store = %store.display(), log = %log.display(), pid = nats.pid(), "nats-server started");
        Ok(nats)
    }

    async fn wait_ready(&mut self, port: u16, log: &Path) -> anyhow::Result<()> {
        for _ in 0..200 {
            if let Some(status) = self.child.try_wait()? {
                let tail = std::fs::read_to_string(log).unwrap_or_default();
                let tail: Vec<&str> = tail.lines().rev().take(5).collect();
                bail!(
                    "nats-server exited at start-up ({status}); last log lines:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("nats-server did not accept connections on port {port} within 10 s")
    }

    /// The client URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or_default()
    }

    /// Stops the server gracefully (SIGTERM, then SIGKILL after 5 s) and forgets its URL.
    pub async fn stop(mut self) {
        let _ = std::fs::remove_file(&self.url_file);
        if let Some(pid) = self.child.id() {
            // SAFETY: sending a signal to our own child's pid.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGTERM);
            }
        }
        match tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await {
            Ok(_) => tracing::info!("nats-server stopped"),
            Err(_) => {
                tracing::warn!("nats-server did not stop within 5 s; killing it");
                let _ = self.child.kill().await;
            }
        }
    }
}

/// 4222 when it is free, else a free port the OS picks.
fn pick_port() -> u16 {
    if std::net::TcpListener::bind(("127.0.0.1", 4222)).is_ok() {
        return 4222;
    }
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(4222)
}

//! The local installation under `./.allot/`: the lock that keeps one `allot up` per folder, the
//! embedded nats-server `allot up` starts and restarts, and how client commands started in the
//! same folder find it.
// One `unsafe` block: asking Linux to kill the nats-server child if we die (PR_SET_PDEATHSIG),
// so even a SIGKILLed `allot up` leaves no server behind. There is no safe std API for it.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::fs::File;
use std::future::Future;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

/// The pinned nats-server version the project installs.
pub const NATS_SERVER_VERSION: &str = "2.15.1";

/// Files `allot up` keeps in its data folder.
pub fn url_file(data_dir: &Path) -> PathBuf {
    data_dir.join("nats.url")
}

/// The lock file of a data folder: whoever holds it is the folder's one `allot up`.
pub fn lock_file(data_dir: &Path) -> PathBuf {
    data_dir.join("lock")
}

/// One `allot up`'s exclusive hold on its data folder: an OS lock on `<data-dir>/lock`, which
/// also names the holder (pid, start time, NATS URL, nats-server pid) for the one refused.
///
/// The kernel drops the lock when the process ends, however it ends (SIGKILL included), so a
/// crashed instance never blocks the next one; a pid file would.
#[derive(Debug)]
pub struct DataDirLock {
    file: File,
    pid: u32,
    started: String,
}

impl DataDirLock {
    /// Creates `data_dir` if needed and takes its lock, before anything else in it is touched;
    /// if another `allot up` holds it, fails with a message naming that one.
    pub fn acquire(data_dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("creating {}", data_dir.display()))?;
        let path = lock_file(data_dir);
        // Neither truncated nor rewritten before the lock is ours: it names the holder. Opened
        // close-on-exec (std's default), so no child — nats-server, a task process — inherits
        // the lock and outlives us holding it.
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                bail!(
                    "another allot up {}already runs in {}; stop it first or use --data-dir",
                    holder_of(&path),
                    data_dir.display()
                )
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("locking {}", path.display()));
            }
        }
        let lock = Self {
            file,
            pid: std::process::id(),
            started: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        };
        lock.record(None, None)?;
        // A `nats.url` here was left by a holder that crashed: its server is gone.
        if std::fs::remove_file(url_file(data_dir)).is_ok() {
            tracing::info!(data_dir = %data_dir.display(), "removed the nats.url of an allot up that did not stop cleanly");
        }
        Ok(lock)
    }

    /// Rewrites the holder's description with the NATS URL and the nats-server's pid, once
    /// known (again after each restart of the server).
    pub fn record(&self, nats: Option<&str>, nats_server_pid: Option<u32>) -> anyhow::Result<()> {
        let mut text = format!("pid={}\nstarted={}\n", self.pid, self.started);
        if let Some(url) = nats {
            text.push_str(&format!("nats={}\n", without_credentials(url)));
        }
        if let Some(pid) = nats_server_pid {
            text.push_str(&format!("nats-server-pid={pid}\n"));
        }
        self.file
            .set_len(0)
            .and_then(|()| self.file.write_all_at(text.as_bytes(), 0))
            .context("writing the data folder's lock file")
    }
}

/// "(pid 1234, started …, nats://…) " as the lock file at `path` names its holder; empty when
/// it names none yet (the holder is between taking the lock and writing to it).
fn holder_of(path: &Path) -> String {
    let mut text = String::new();
    // The holder writes right after locking: give it a moment rather than say nothing.
    for _ in 0..10 {
        text = std::fs::read_to_string(path).unwrap_or_default();
        if !text.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(str::to_owned)
    };
    let mut parts = Vec::new();
    if let Some(pid) = field("pid") {
        parts.push(format!("pid {pid}"));
    }
    if let Some(started) = field("started") {
        parts.push(format!("started {started}"));
    }
    if let Some(url) = field("nats") {
        parts.push(url);
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("({}) ", parts.join(", "))
    }
}

/// `url` without the user and password or token it may carry: the lock file and the messages
/// that quote it are no place for credentials.
fn without_credentials(url: &str) -> String {
    let server = |s: &str| match s.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((_, host)) => format!("{scheme}://{host}"),
            None => s.to_owned(),
        },
        None => s.to_owned(),
    };
    url.split(',').map(server).collect::<Vec<_>>().join(",")
}

/// The URL client commands use: `--nats`, then `ALLOT_NATS_URL`, then the `nats.url` written by
/// an `allot up` in this folder — with the `admin` credentials it keeps beside it written in,
/// since its server lets no anonymous client in — then the default port.
///
/// `ALLOT_CREDENTIALS=FILE` (a `<user>.credentials.json` that `allot up` or `allot nats-config`
/// wrote, e.g. a team's handed to its CI) logs in as that file's user instead of `admin`, at the
/// file's URL unless `--nats` or `ALLOT_NATS_URL` names another. It is read here, not passed on
/// the command line, so the password never shows in `ps`.
///
/// The URL may hold a password: show it with [`allot_bus::users::without_credentials`].
pub fn discover_url(
    flag: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
    data_dir: &Path,
) -> anyhow::Result<(String, String)> {
    let named = flag
        .map(|url| (url.to_owned(), "--nats".to_owned()))
        .or_else(|| env("ALLOT_NATS_URL").map(|url| (url, "ALLOT_NATS_URL".to_owned())));
    if let Some(path) = env("ALLOT_CREDENTIALS") {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading ALLOT_CREDENTIALS={path}"))?;
        let creds: allot_bus::Credentials = serde_json::from_str(&text).with_context(|| {
            format!(
                "ALLOT_CREDENTIALS={path} is not a credentials file (JSON with user, password \
                 and url, as `allot up` writes into .allot/auth/)"
            )
        })?;
        let (url, origin) = named.unwrap_or_else(|| (creds.url.clone(), path.clone()));
        let url = allot_bus::users::url_with_credentials(&url, &creds.user, &creds.password);
        return Ok((
            url,
            format!("{origin}, as {} from ALLOT_CREDENTIALS", creds.user),
        ));
    }
    if let Some(named) = named {
        return Ok(named);
    }
    if let Ok(url) = std::fs::read_to_string(url_file(data_dir)) {
        let url = match super::auth::admin_credentials(data_dir) {
            Some(admin) => {
                allot_bus::users::url_with_credentials(url.trim(), &admin.user, &admin.password)
            }
            None => url.trim().to_owned(),
        };
        return Ok((url, url_file(data_dir).display().to_string()));
    }
    Ok(("nats://127.0.0.1:4222".into(), DEFAULT_ORIGIN.into()))
}

/// Where [`discover_url`] says the URL came from when nothing named one.
const DEFAULT_ORIGIN: &str = "the default";

/// The instance a client command talks to: `--nats`, then `ALLOT_NATS_URL`, then the `nats.url`
/// of the data folder — `data_dir` (`--data-dir`), then `ALLOT_DATA_DIR`, then `./.allot`. A
/// folder that was named but holds no running Allot is an error, never a silent fall-back to
/// someone else's server; without one named, the default port is tried and stderr says so.
/// Returns the URL (it may hold a password) and where it came from.
pub fn instance_url(
    nats: Option<&str>,
    data_dir: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<(String, String)> {
    let named = data_dir
        .map(|d| (d.to_owned(), "--data-dir"))
        .or_else(|| env("ALLOT_DATA_DIR").map(|d| (d, "ALLOT_DATA_DIR")));
    let dir = named
        .as_ref()
        .map_or(".allot", |(d, _)| d.as_str())
        .to_owned();
    let (url, origin) = discover_url(nats, env, Path::new(&dir))?;
    if origin == DEFAULT_ORIGIN {
        if let Some((dir, how)) = named {
            bail!(
                "no Allot is running in {dir} (from {how}): it has no nats.url. Start one with \
                 `allot up --data-dir {dir}`, or pass --nats URL"
            );
        }
        eprintln!(
            "allot: no Allot in this folder (no ./.allot/nats.url); trying {url}, the default"
        );
    }
    Ok((url, origin))
}

/// Connects a client command (`submit`, `abort` …) as `name` to the instance
/// [`instance_url`] finds; if it is not reachable, the error says where the URL came from and
/// that `nothing` happened.
pub async fn connect_client(
    name: &str,
    nats: Option<&str>,
    data_dir: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
    nothing: &str,
) -> anyhow::Result<Connection> {
    let (url, origin) = instance_url(nats, data_dir, env)?;
    let client = connect_url(name, &url, &origin)
        .await
        .context(nothing.to_owned())?;
    Ok(Connection {
        client,
        team: team_of_url(&url),
        origin,
    })
}

/// A client command's connection to its instance.
pub struct Connection {
    /// The connected client.
    pub client: async_nats::Client,
    /// The team the user logged in for (`team-<team>`), whose subjects alone the server lets
    /// it use; `None` for `admin` or a server without Allot's users.
    pub team: Option<String>,
    /// Where the URL came from (for messages).
    pub origin: String,
}

impl Connection {
    /// Why a team's user may not do `what` for `team` (another team's): the server would
    /// refuse the publish anyway, but only as a permissions violation in its log and a
    /// timeout here. The caller says so and exits 2.
    pub fn refuses_team(&self, team: &str, what: &str) -> Option<String> {
        match &self.team {
            Some(mine) if mine != team => Some(format!(
                "{what} is for team {team}, but you are logged in as team-{mine} (from {}), \
                 which may act for team {mine} only",
                self.origin
            )),
            _ => None,
        }
    }
}

/// The team of a `team-<team>` user named in `url`, if any.
pub fn team_of_url(url: &str) -> Option<String> {
    allot_bus::server_list(url).into_iter().find_map(|s| {
        let addr: async_nats::ServerAddr = s.parse().ok()?;
        addr.username()?.strip_prefix("team-").map(str::to_owned)
    })
}

/// Connects client `name` to `url` (found from `origin`), once, within 2 s. The error says
/// which it was — the server refused the credentials, or it could not be reached — and never
/// shows the password.
pub async fn connect_url(
    name: &str,
    url: &str,
    origin: &str,
) -> anyhow::Result<async_nats::Client> {
    let shown = allot_bus::users::without_credentials(url);
    allot_bus::connect::with_url_credentials(async_nats::ConnectOptions::new(), url)
        .name(name)
        .connection_timeout(Duration::from_secs(2))
        .connect(allot_bus::server_list(url))
        .await
        .map_err(|e| match e.kind() {
            async_nats::ConnectErrorKind::AuthorizationViolation
            | async_nats::ConnectErrorKind::Authentication => anyhow::anyhow!(
                "NATS at {shown} (from {origin}) refused the login: wrong user or password \
                 (in this folder the credentials are .allot/auth/admin.credentials.json; with \
                 --nats give nats://USER:PASSWORD@HOST:PORT)"
            ),
            _ => anyhow::anyhow!(
                "NATS at {shown} (from {origin}) is not reachable ({}): is `allot up` running \
                 in this folder? (or pass --nats URL)",
                e.kind()
            ),
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
    /// Kept to start the same server again (same port, store and log) after it died.
    command: Command,
    port: u16,
    log: PathBuf,
    url: String,
    url_file: PathBuf,
    announced: bool,
}

impl EmbeddedNats {
    /// Writes `nats.url`, through which client commands in this folder find the server: call
    /// it once the streams exist, so a command that finds the file finds a working Allot.
    pub fn announce(&mut self) -> anyhow::Result<()> {
        allot_runtime::files::write_whole(
            &self.url_file,
            format!("{}\n", self.url).as_bytes(),
            0o644,
        )
        .with_context(|| format!("writing {}", self.url_file.display()))?;
        self.announced = true;
        Ok(())
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
            command,
            port,
            log: log.clone(),
            url: url.clone(),
            url_file: url_file(data_dir),
            announced: false,
        };
        nats.wait_ready().await?;
        tracing::info!(%url, store = %store.display(), log = %log.display(), pid = nats.pid(), "nats-server started");
        Ok(nats)
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let port = self.port;
        for _ in 0..200 {
            if let Some(status) = self.child.try_wait()? {
                let tail = std::fs::read_to_string(&self.log).unwrap_or_default();
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

    /// Starts the same server again — same port, store and log — after it exited, and waits
    /// until it accepts clients; the services' connections find it by themselves.
    async fn restart(&mut self) -> anyhow::Result<()> {
        self.child = self.command.spawn().context("starting nats-server again")?;
        if let Err(e) = self.wait_ready().await {
            // Up but deaf: do not leave it holding the port for the next attempt.
            let _ = self.child.kill().await;
            return Err(e);
        }
        Ok(())
    }

    /// Keeps the server running until `stop` completes, then stops it: when it exits on its
    /// own it is reaped, logged and started again, as long as `limit` allows; past that, the
    /// error says how it ended. `started` is told the pid of every (re)started server.
    pub async fn supervise(
        mut self,
        mut limit: RestartLimit,
        mut started: impl FnMut(&Self),
        stop: impl Future<Output = ()>,
    ) -> anyhow::Result<()> {
        tokio::pin!(stop);
        started(&self);
        loop {
            let pid = self.pid();
            let status = tokio::select! {
                () = &mut stop => {
                    self.stop().await;
                    return Ok(());
                }
                status = self.child.wait() => status.context("waiting for nats-server")?,
            };
            tracing::error!(pid, %status, log = %self.log.display(), "nats-server exited unexpectedly");
            if let Err(e) = self.restart_within(&mut limit, status, &mut stop).await {
                // Clients must not be sent to a server that is gone for good.
                self.forget_url();
                return Err(e);
            }
            tracing::info!(url = %self.url, pid = self.pid(), "nats-server restarted on the same port and store");
            started(&self);
        }
    }

    /// Restarts the server that just ended with `status`, retrying failed starts, until one
    /// succeeds or `limit` is spent.
    async fn restart_within(
        &mut self,
        limit: &mut RestartLimit,
        mut status: ExitStatus,
        stop: &mut (impl Future<Output = ()> + Unpin),
    ) -> anyhow::Result<()> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            if !limit.allows(Instant::now()) {
                bail!(
                    "nats-server exited unexpectedly ({status}); restarts exhausted ({} allowed \
                     within {}; its log: {})",
                    limit.max,
                    humantime::format_duration(limit.window),
                    self.log.display()
                );
            }
            // A server that dies at once would otherwise be restarted in a tight loop.
            let pause = allot_bus::connect::backoff(attempt, Duration::from_secs(2));
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = &mut *stop => {
                    self.forget_url();
                    return Ok(());
                }
            }
            match self.restart().await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), "nats-server did not come back");
                    status = self.child.wait().await.context("waiting for nats-server")?;
                }
            }
        }
    }

    /// Removes `nats.url` if this server wrote it: no other instance's file is ours to remove.
    fn forget_url(&self) {
        if self.announced {
            let _ = std::fs::remove_file(&self.url_file);
        }
    }

    /// Stops the server gracefully (SIGTERM, then SIGKILL after 5 s) and forgets its URL if
    /// it announced it.
    pub async fn stop(mut self) {
        self.forget_url();
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

/// How often the embedded nats-server may be restarted: at most `max` times within `window`.
#[derive(Debug, Clone)]
pub struct RestartLimit {
    max: u32,
    window: Duration,
    recent: VecDeque<Instant>,
}

impl RestartLimit {
    /// At most `max` restarts within any `window`.
    pub fn new(max: u32, window: Duration) -> Self {
        Self {
            max,
            window,
            recent: VecDeque::new(),
        }
    }

    /// Whether one more restart at `now` stays within the limit; if so, it is counted.
    fn allows(&mut self, now: Instant) -> bool {
        while self
            .recent
            .front()
            .is_some_and(|&t| now.duration_since(t) >= self.window)
        {
            self.recent.pop_front();
        }
        if self.recent.len() >= self.max as usize {
            return false;
        }
        self.recent.push_back(now);
        true
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

#[cfg(test)]
mod tests;

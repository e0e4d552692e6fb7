//! Spawning `allot` processes and waiting on them.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `allot` as built by cargo for these tests, with the project's nats-server.
pub fn allot(cwd: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
    cmd.current_dir(cwd)
        .env_remove("ALLOT_NATS_URL")
        .env_remove("ALLOT_CREDENTIALS")
        .env_remove("ALLOT_DATA_DIR")
        .env_remove("ALLOT_TEAM")
        // ALLOT_TEST_LOG chooses the processes' log filter when a test needs looking into.
        .env(
            "ALLOT_LOG",
            std::env::var("ALLOT_TEST_LOG").unwrap_or_else(|_| "info,async_nats=warn".into()),
        )
        // Tests run several `allot run` at once: each takes a free port for its ops endpoints.
        .env("ALLOT_OPS_ADDR", "127.0.0.1:0")
        .stdin(Stdio::null());
    if let Ok(binary) = allot_testkit::nats_server_binary() {
        cmd.env("ALLOT_NATS_SERVER", binary);
    }
    cmd
}

/// Starts `cmd` with stdout and stderr going to `<dir>/<name>.log`.
pub fn spawn_logged(mut cmd: Command, dir: &Path, name: &str) -> Child {
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    cmd.stdout(log.try_clone().unwrap()).stderr(log);
    cmd.spawn().unwrap()
}

/// The log a process spawned by [`spawn_logged`] wrote so far.
pub fn log_of(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default()
}

/// The warnings and errors of every process log in `dir` (`*.log`), the last `per_log` of
/// each: for the end of a failure message, where a truncated report still shows them.
pub fn warnings_in(dir: &Path, per_log: usize) -> String {
    let mut logs: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    logs.retain(|p| p.extension().is_some_and(|e| e == "log"));
    logs.sort();
    let mut out = String::new();
    for log in logs {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let bad: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .collect();
        let name = log.file_name().unwrap_or_default().to_string_lossy();
        out.push_str(&format!("{name}: {} warnings and errors\n", bad.len()));
        for line in &bad[bad.len().saturating_sub(per_log)..] {
            out.push_str("  ");
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Polls `probe` every 50 ms until it returns `Some`, for at most `limit`.
pub fn wait_for<T>(limit: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(t) = probe() {
            return Some(t);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// Sends SIGTERM to a process.
pub fn terminate(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Sends `SIG<name>` (`STOP`, `CONT`, `KILL` …) to `pid`.
pub fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name} {pid}");
}

/// Waits for a child to exit, for at most `limit`.
pub fn wait_exit(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    wait_for(limit, || child.try_wait().unwrap())
}

/// Pids of live processes whose command line mentions `needle`.
pub fn processes_mentioning(needle: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        // A zombie has an empty command line; it is gone for every practical purpose.
        if cmdline.contains(needle) {
            pids.push(pid);
        }
    }
    pids
}

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The gateway's URL (without a trailing slash) and admin token of the `allot up` running in
/// `dir`, once it has written them; `log` names its log for the panic message.
pub fn gateway_of(dir: &Path, log: &str) -> (String, String) {
    let data = dir.join(".allot");
    let url = wait_for(Duration::from_secs(90), || {
        let url = std::fs::read_to_string(data.join("gateway.url")).ok()?;
        data.join("admin.token")
            .exists()
            .then(|| url.trim().trim_end_matches('/').to_owned())
    })
    .unwrap_or_else(|| panic!("no gateway URL; allot up:\n{}", log_of(dir, log)));
    let token = std::fs::read_to_string(data.join("admin.token")).unwrap();
    (url, token.trim().to_owned())
}

/// `GET path` of the gateway at `addr` (host:port) with the bearer `token`: the HTTP status and
/// the body, or `None` if the gateway could not be asked.
pub fn api_get(addr: &str, token: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read as _, Write as _};
    let mut conn = std::net::TcpStream::connect(addr).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        conn,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    conn.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

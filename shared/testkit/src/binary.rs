//! Locating the `nats-server` executable.

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Environment variable that names the `nats-server` binary to use, overriding every other place.
pub const NATS_SERVER_ENV: &str = "ALLOT_NATS_SERVER";

/// Path of the nats-server binary: `$ALLOT_NATS_SERVER` if set, else
/// `<workspace root>/.tools/bin/nats-server` if it exists, else `nats-server` found on `PATH`.
///
/// A set but wrong `$ALLOT_NATS_SERVER` is an error rather than a silent fallback, so a test run
/// never uses a different server than the one asked for.
pub fn nats_server_binary() -> Result<PathBuf, MissingNatsServer> {
    locate(|key| std::env::var_os(key), &workspace_root())
}

/// No usable `nats-server` binary was found.
///
/// Its message lists every place that was tried and how to install the pinned server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "nats-server not found; tried: {}; install it with: scripts/install-nats.sh (from the project root)",
    .tried.join("; ")
)]
pub struct MissingNatsServer {
    tried: Vec<String>,
}

impl MissingNatsServer {
    /// Each place that was tried, with why it did not do.
    pub fn tried(&self) -> &[String] {
        &self.tried
    }
}

/// The workspace root: two levels above this crate's manifest directory.
pub fn workspace_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// The search behind [`nats_server_binary`], with the environment injected so tests need not
/// change the process environment.
fn locate(
    env: impl Fn(&str) -> Option<OsString>,
    workspace_root: &Path,
) -> Result<PathBuf, MissingNatsServer> {
    let mut tried = Vec::new();

    if let Some(path) = env(NATS_SERVER_ENV) {
        let path = PathBuf::from(path);
        if is_executable(&path) {
            return Ok(path);
        }
        tried.push(format!(
            "${NATS_SERVER_ENV}={} (not an executable file)",
            path.display()
        ));
        return Err(MissingNatsServer { tried });
    }
    tried.push(format!("${NATS_SERVER_ENV} (not set)"));

    let local = workspace_root.join(".tools/bin/nats-server");
    if is_executable(&local) {
        return Ok(local);
    }
    tried.push(format!("{} (missing)", local.display()));

    let path_var = env("PATH").unwrap_or_default();
    if let Some(found) = std::env::split_paths(&path_var)
        .map(|dir| dir.join("nats-server"))
        .find(|candidate| is_executable(candidate))
    {
        return Ok(found);
    }
    tried.push("nats-server on PATH (not found)".to_owned());

    Err(MissingNatsServer { tried })
}

/// True for a regular file (after following symlinks) with an execute bit set.
fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests;

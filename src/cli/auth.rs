//! The users of `allot up`'s nats-server, kept in `<data dir>/auth/` (mode 0700): the server's
//! `authorization` block (`nats-users.conf`) and one `<user>.credentials.json` per user (mode
//! 0600): `admin`, each service, `collector-<node>` per simulated node and `team-<team>` per team
//! of the teams file. Passwords are kept from one start to the next, so credentials handed to a
//! team or a CI job stay valid; users no longer generated lose their file.
//!
//! Client commands started in the same folder log in as `admin` with [`admin_credentials`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;

use allot_bus::Credentials;
use allot_bus::users::{Role, Users};

const CREDENTIALS_SUFFIX: &str = ".credentials.json";

/// `<data dir>/auth`: the users' secrets.
pub fn auth_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("auth")
}

/// The server's `authorization` block, given to nats-server with `--config`.
pub fn server_config_file(data_dir: &Path) -> PathBuf {
    auth_dir(data_dir).join("nats-users.conf")
}

/// Where `user`'s credentials are: `<data dir>/auth/<user>.credentials.json`.
pub fn credentials_file(data_dir: &Path, user: &str) -> PathBuf {
    auth_dir(data_dir).join(format!("{user}{CREDENTIALS_SUFFIX}"))
}

/// Generates the users of `nodes` and `teams` (keeping the passwords of users that already have
/// a credentials file) and writes the server's configuration; returns them.
pub fn prepare(data_dir: &Path, nodes: &[String], teams: &[String]) -> anyhow::Result<Users> {
    let dir = auth_dir(data_dir);
    create_private_dir(&dir)?;
    let previous = read_all(&dir)?;
    let passwords = previous
        .iter()
        .map(|(user, c)| (user.clone(), c.password.clone()))
        .collect::<BTreeMap<_, _>>();
    let users = Users::generate_random(nodes, teams, &passwords)
        .context("generating the NATS users of allot up")?;
    for stale in previous
        .keys()
        .filter(|user| !users.iter().any(|u| &u.role.user() == *user))
    {
        let path = credentials_file(data_dir, stale);
        std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    }
    write_private(&server_config_file(data_dir), &users.render())?;
    Ok(users)
}

/// Writes every user's credentials for the server at `url` (without credentials).
pub fn write_credentials(data_dir: &Path, users: &Users, url: &str) -> anyhow::Result<()> {
    for user in users.iter() {
        let creds = users
            .credentials(&user.role, url)
            .context("a generated user has credentials")?;
        let text = serde_json::to_string_pretty(&creds)? + "\n";
        write_private(&credentials_file(data_dir, &creds.user), &text)?;
    }
    Ok(())
}

/// The `admin` credentials `allot up` wrote in `data_dir`, if any.
pub fn admin_credentials(data_dir: &Path) -> Option<Credentials> {
    let path = credentials_file(data_dir, &Role::Admin.user());
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

/// Every credentials file in `dir`, by user.
fn read_all(dir: &Path) -> anyhow::Result<BTreeMap<String, Credentials>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let is_credentials = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with(CREDENTIALS_SUFFIX));
        if !is_credentials {
            continue;
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        // A file that does not parse is replaced: its user gets a fresh password.
        if let Ok(creds) = serde_json::from_str::<Credentials>(&text) {
            out.insert(creds.user.clone(), creds);
        }
    }
    Ok(out)
}

fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("making {} private", dir.display()))
}

/// Writes a secret readable by the owner only (also when the file existed with wider rights),
/// whole: `allot up` rewrites the credentials at every start while commands beside it read them.
fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    allot_runtime::files::write_whole(path, text.as_bytes(), 0o600)
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn secrets_are_private_and_passwords_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let nodes = ["node-1".to_owned()];
        let first = prepare(dir.path(), &nodes, &["vision".to_owned()]).unwrap();
        write_credentials(dir.path(), &first, "nats://127.0.0.1:4222").unwrap();
        assert_eq!(mode(&auth_dir(dir.path())), 0o700);
        assert_eq!(mode(&server_config_file(dir.path())), 0o600);
        let team = credentials_file(dir.path(), "team-vision");
        assert_eq!(mode(&team), 0o600);
        let admin = admin_credentials(dir.path()).unwrap();
        assert_eq!(admin.user, "admin");

        // Restarted without the team: the others keep their passwords, the team loses its file.
        let second = prepare(dir.path(), &nodes, &[]).unwrap();
        assert_eq!(second.get(&Role::Admin).unwrap().password, admin.password);
        assert!(!team.exists());
        assert!(second.get(&Role::Team("vision".into())).is_none());
    }
}

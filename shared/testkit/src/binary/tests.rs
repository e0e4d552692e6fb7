use super::*;

use std::collections::HashMap;

/// A fake workspace with optional executables at the places `locate` looks.
struct Fixture {
    dir: tempfile::TempDir,
    env: HashMap<String, OsString>,
}

impl Fixture {
    fn new() -> Fixture {
        Fixture {
            dir: tempfile::tempdir().expect("temp dir"),
            env: HashMap::new(),
        }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("workspace")
    }

    fn executable(&self, relative: &str) -> PathBuf {
        let path = self.dir.path().join(relative);
        fs::create_dir_all(path.parent().expect("has parent")).expect("create dirs");
        fs::write(&path, "#!/bin/sh\n").expect("write");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod");
        path
    }

    fn set(&mut self, key: &str, value: impl Into<OsString>) {
        self.env.insert(key.to_owned(), value.into());
    }

    fn locate(&self) -> Result<PathBuf, MissingNatsServer> {
        locate(|key| self.env.get(key).cloned(), &self.root())
    }
}

#[test]
fn env_override_wins_over_local_tools_and_path() {
    let mut fx = Fixture::new();
    let chosen = fx.executable("custom/nats-server");
    fx.executable("workspace/.tools/bin/nats-server");
    let on_path = fx.executable("bin/nats-server");
    fx.set(NATS_SERVER_ENV, chosen.clone());
    fx.set("PATH", on_path.parent().expect("dir"));

    assert_eq!(fx.locate(), Ok(chosen));
}

#[test]
fn env_override_to_a_missing_file_is_an_error_not_a_fallback() {
    let mut fx = Fixture::new();
    fx.executable("workspace/.tools/bin/nats-server");
    fx.set(NATS_SERVER_ENV, "/nowhere/nats-server");

    let err = fx.locate().expect_err("must not fall back");

    assert!(
        err.to_string()
            .contains("$ALLOT_NATS_SERVER=/nowhere/nats-server"),
        "{err}"
    );
}

#[test]
fn local_tools_copy_is_preferred_to_path() {
    let mut fx = Fixture::new();
    let local = fx.executable("workspace/.tools/bin/nats-server");
    let on_path = fx.executable("bin/nats-server");
    fx.set("PATH", on_path.parent().expect("dir"));

    assert_eq!(fx.locate(), Ok(local));
}

#[test]
fn path_is_searched_in_order_when_nothing_else_is_there() {
    let mut fx = Fixture::new();
    let first = fx.executable("a/nats-server");
    fx.executable("b/nats-server");
    let path = std::env::join_paths([
        fx.dir.path().join("empty"),
        fx.dir.path().join("a"),
        fx.dir.path().join("b"),
    ])
    .expect("join");
    fx.set("PATH", path);

    assert_eq!(fx.locate(), Ok(first));
}

#[test]
fn a_file_without_execute_permission_is_skipped() {
    let mut fx = Fixture::new();
    let plain = fx.dir.path().join("bin/nats-server");
    fs::create_dir_all(plain.parent().expect("dir")).expect("mkdir");
    fs::write(&plain, "not runnable").expect("write");
    fx.set("PATH", plain.parent().expect("dir"));

    assert!(fx.locate().is_err());
}

#[test]
fn missing_everywhere_names_every_place_tried_and_the_install_script() {
    let fx = Fixture::new();

    let message = fx.locate().expect_err("nothing installed").to_string();

    let local = fx.root().join(".tools/bin/nats-server");
    for want in [
        "$ALLOT_NATS_SERVER (not set)",
        &format!("{} (missing)", local.display()),
        "nats-server on PATH (not found)",
        "install it with: scripts/install-nats.sh (from the project root)",
    ] {
        assert!(message.contains(want), "{want:?} not in {message:?}");
    }
}

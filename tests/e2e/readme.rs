//! The README as a newcomer follows it: every command in its shell blocks, in order, as
//! written — with `cargo run -q --` being the `allot` on the PATH, and `./dev up` being
//! `allot up` with the teams file it passes — run from a fresh folder holding `examples/`.
//! A command the README shows that fails here fails the test; so does one it stops showing
//! without this test noticing (the list is read from the README itself).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::support::{allot, free_port, log_of, spawn_logged, terminate, wait_exit, wait_for};

/// The shell commands of the README's ```sh blocks, comments stripped, in order.
fn readme_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md");
    let mut commands = Vec::new();
    let mut in_sh = false;
    for line in readme.lines() {
        if line.starts_with("```") {
            in_sh = line.trim() == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        let command = line.split(" #").next().unwrap_or_default().trim();
        if !command.is_empty() {
            commands.push(command.to_owned());
        }
    }
    commands
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

#[test]
fn every_command_the_readme_shows_works_as_written() {
    let commands = readme_commands();
    assert!(
        commands.iter().any(|c| c.starts_with("./dev up")),
        "the README no longer starts Allot with ./dev up: {commands:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    copy_dir(&root.join("examples"), &dir.path().join("examples"));
    // The CI snippet submits the pipeline of the repository it runs in.
    std::fs::copy(
        root.join("examples/train-eval.yaml"),
        dir.path().join("pipeline.yaml"),
    )
    .unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_allot")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );

    let mut up = allot(dir.path());
    // What `./dev up` runs (its teams file included); 3600x so hours of estimates take seconds.
    up.args([
        "up",
        "--teams",
        "examples/teams.yaml",
        "--sim-speedup",
        "3600",
    ])
    .args(["--nats-port", &free_port().to_string()]);
    let mut up = spawn_logged(up, dir.path(), "up");
    wait_for(Duration::from_secs(60), || {
        dir.path().join(".allot/nats.url").exists().then_some(())
    })
    .expect("allot up wrote its URL");

    let mut ran = 0;
    for command in &commands {
        if command.starts_with("./dev ") {
            continue; // the two commands of the quick start: this suite is one, `up` runs above
        }
        let line = command.replace("cargo run -q --", "allot");
        // `curl` lines call the gateway `allot up` serves, with the token it wrote.
        assert!(
            line.starts_with("allot ") || line.starts_with("curl "),
            "a README command this test does not know how to run: {command}"
        );
        // The inventory may not have heard of every node yet right after start: `status`
        // is retried, the rest runs once.
        let run = || {
            Command::new("sh")
                .args(["-c", &line])
                .current_dir(dir.path())
                .env("PATH", &path)
                .env("CI_PIPELINE_ID", "4711")
                .env_remove("ALLOT_NATS_URL")
                .output()
                .unwrap()
        };
        let out = wait_for(Duration::from_secs(20), || {
            let out = run();
            out.status.success().then_some(out)
        })
        .unwrap_or_else(|| {
            let out = run();
            panic!(
                "`{command}` failed ({}):\n{}\n{}\nallot up:\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                log_of(dir.path(), "up")
            )
        });
        assert!(
            !out.stdout.is_empty() || !out.stderr.is_empty(),
            "`{command}` said nothing"
        );
        ran += 1;
    }
    assert!(ran >= 5, "only {ran} README commands ran: {commands:?}");
    terminate(&up);
    assert!(wait_exit(&mut up, Duration::from_secs(30)).is_some_and(|s| s.success()));
}

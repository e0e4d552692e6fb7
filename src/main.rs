//! `allot`: the Allot binary. Parses the command line, sets up logging, and hands over to
//! [`cli`]; everything else lives in the service and library crates.

mod cli;

use clap::Parser;

// The services allocate many small, short-lived buffers per message (JSON, SQLite rows);
// mimalloc serves that pattern markedly faster than glibc's allocator (docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let args = cli::Cli::parse();
    cli::init_tracing(&args);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("allot: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::dispatch(args)) {
        Ok(code) => code,
        // The reader went away (`allot status --json | head`): nothing to say to anyone.
        Err(e) if broken_pipe(&e) => std::process::ExitCode::SUCCESS,
        // Bad input: every problem was listed, nothing was started.
        Err(e) if e.chain().any(|c| c.is::<cli::settings::InvalidSettings>()) => {
            eprintln!("allot: {e:#}");
            std::process::ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("allot: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Whether `e` is standard output closed under us.
fn broken_pipe(e: &anyhow::Error) -> bool {
    let pipe = Some(std::io::ErrorKind::BrokenPipe);
    e.chain().any(|cause| {
        cause.downcast_ref::<std::io::Error>().map(|io| io.kind()) == pipe
            // JSON written straight to stdout fails inside serde_json.
            || cause
                .downcast_ref::<serde_json::Error>()
                .and_then(serde_json::Error::io_error_kind)
                == pipe
    })
}

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
        Err(e) => {
            eprintln!("allot: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

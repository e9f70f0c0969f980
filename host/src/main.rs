//! The `wasmstate` command.

use clap::Parser;
use std::io::IsTerminal;
use std::process::ExitCode;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    // A compiler child (the server re-executes itself to compile a guest,
    // so the compiler's memory leaves with the child) does only that.
    if let Some(code) = wasmstate::runtime::child_main_if_asked() {
        return code;
    }
    let cli = wasmstate::cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("WASMSTATE_LOG")
                .unwrap_or_else(|_| EnvFilter::new(cli.default_log_filter())),
        )
        .with_writer(wasmstate::logline::OneLineStderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    // States, keys and caches are the owner's alone, whatever the umask of
    // the shell or unit that started us (guests create files too).
    rustix::process::umask(rustix::fs::Mode::from_bits_truncate(0o077));
    // Every connection is a descriptor: take all the system allows (the
    // soft limit is often 1,024 of a far larger hard one), before the
    // config's default connection cap is derived from it.
    let nofile = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    if nofile.current < nofile.maximum {
        let raised = rustix::process::Rlimit {
            current: nofile.maximum,
            maximum: nofile.maximum,
        };
        let _ = rustix::process::setrlimit(rustix::process::Resource::Nofile, raised);
    }
    match wasmstate::cli::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

//! The `fjord` command: `serve`, `scram add`, `dump-log`, and with the `tools` feature
//! (on by default) `bench`, `chaos` and `report`.

use clap::{Parser, Subcommand};
use std::io::Write;

#[global_allocator]
static ALLOC: fjord::alloc::BrokerAlloc = fjord::alloc::BrokerAlloc;

#[derive(Parser)]
#[command(
    name = "fjord",
    version,
    about = "A Kafka-compatible broker, thread-per-core on io_uring"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the broker.
    Serve(Box<fjord::config::ServeArgs>),
    /// Manage SCRAM users offline (like `kafka-storage format --add-scram`).
    #[command(subcommand)]
    Scram(fjord::metadata::credentials::ScramCommand),
    /// Print segments, indexes and snapshots like kafka-dump-log.sh.
    DumpLog(fjord::log::dump::DumpLogArgs),
    /// Drive any Kafka-compatible broker with an open-loop workload and record latencies.
    #[cfg(feature = "tools")]
    Bench(Box<fjord::bench::BenchArgs>),
    #[cfg(feature = "tools")]
    /// Kill -9 a broker at random moments under load and check what survived (Jepsen-style).
    Chaos(Box<fjord::chaos::ChaosArgs>),
    #[cfg(feature = "tools")]
    /// Turn bench results (JSON) into an HTML + Markdown report with SVG charts.
    Report(fjord::report::ReportArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => fjord::server::run(*args),
        Command::DumpLog(args) => ignore_broken_pipe(dump_log(args)),
        Command::Scram(command) => fjord::metadata::credentials::run(command),
        #[cfg(feature = "tools")]
        Command::Bench(args) => fjord::bench::run(*args).map(|_| ()).map_err(Into::into),
        #[cfg(feature = "tools")]
        Command::Chaos(args) => fjord::chaos::run(*args).map_err(Into::into),
        #[cfg(feature = "tools")]
        Command::Report(args) => fjord::report::run(args).map_err(Into::into),
    }
}

/// A reader that stops early (`fjord dump-log ... | head`) closes the pipe:
/// that ends the dump, it is not an error.
fn ignore_broken_pipe(result: anyhow::Result<()>) -> anyhow::Result<()> {
    match result {
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            Ok(())
        }
        other => other,
    }
}

/// `fjord dump-log`: producer snapshots are printed by the producer module,
/// every other file by the log's dumper (with the group coordinator's
/// record decoder for `--offsets-decoder`).
fn dump_log(mut args: fjord::log::dump::DumpLogArgs) -> anyhow::Result<()> {
    let is_snapshot = |f: &std::path::PathBuf| f.extension().is_some_and(|e| e == "snapshot");
    let mut rest = Vec::new();
    let stdout = std::io::stdout();
    for f in args.files.drain(..).chain(args.files_flag.drain(..)) {
        if is_snapshot(&f) {
            let mut out = stdout.lock();
            writeln!(out, "Dumping {}", f.display())?;
            for line in fjord::producer::snapshot::describe(&f)? {
                writeln!(out, "{line}")?;
            }
        } else {
            rest.push(f);
        }
    }
    if rest.is_empty() {
        return Ok(());
    }
    args.files = rest;
    // The log's dumper cannot know the group coordinator's record formats
    // (layering): hand it the decoder.
    args.record_formatter = Some(fjord::group::records::describe);
    args.txn_record_formatter = Some(fjord::txn::log::describe);
    fjord::log::dump::run(args)
}

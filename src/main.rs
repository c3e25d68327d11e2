//! The `fjord` command: `serve`, `dump-log`, and (later) `bench`, `report`.

use clap::{Parser, Subcommand};

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
    Serve(fjord::config::ServeArgs),
    /// Print segments, indexes and snapshots like kafka-dump-log.sh.
    DumpLog(fjord::log::dump::DumpLogArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => fjord::server::run(args),
        Command::DumpLog(args) => fjord::log::dump::run(args),
    }
}

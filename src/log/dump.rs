//! `fjord dump-log` (in progress).

/// Arguments of `fjord dump-log`.
#[derive(clap::Args, Debug)]
pub struct DumpLogArgs {
    /// Segment, index, time-index, txn-index or snapshot files.
    pub files: Vec<std::path::PathBuf>,
}

pub fn run(_args: DumpLogArgs) -> anyhow::Result<()> {
    anyhow::bail!("dump-log is not implemented yet")
}

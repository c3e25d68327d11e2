//! (in progress) Broker configuration.

/// Flags of `fjord serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Directory holding all partition logs and metadata.
    #[arg(long, default_value = "./data")]
    pub data_dir: std::path::PathBuf,
}

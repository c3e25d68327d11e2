//! `fjord scram add`: the first SCRAM user, created offline, the way
//! Kafka's `kafka-storage format --add-scram` does it.
//!
//! A broker whose listeners all require SASL has no user to log in with
//! until one exists, and AlterUserScramCredentials needs a logged-in
//! client: the first (admin) user is therefore written straight into the
//! metadata log of a stopped broker. The record is the one the controller
//! writes for AlterUserScramCredentials (`MetadataRecord::UserScramCredential`,
//! salted: the password itself is never written), committed to the Raft
//! metadata log by `metadata::store` (fdatasync'ed) exactly as the broker
//! commits it. The data dir's lock (`store::lock_data_dir`) is
//! taken first, so this refuses to run beside a broker that owns the log.

use super::{store, MetadataRecord};
use crate::auth::scram::{ScramMechanism, ITERATIONS_MAX, ITERATIONS_MIN};
use std::path::PathBuf;

/// Arguments of `fjord scram add`.
#[derive(clap::Args, Debug, Clone)]
pub struct ScramAddArgs {
    /// The broker's data directory (created if missing).
    #[arg(long)]
    pub data_dir: PathBuf,
    /// The user name (the principal is `User:<name>`).
    #[arg(long)]
    pub user: String,
    /// `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    #[arg(long)]
    pub mechanism: String,
    /// The password (salted here; only the salted keys are stored).
    #[arg(long)]
    pub password: String,
    /// PBKDF2 iterations, 4096 to 16384 [default: 4096].
    #[arg(long, default_value_t = ITERATIONS_MIN)]
    pub iterations: i32,
}

/// Subcommands of `fjord scram`.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum ScramCommand {
    /// Add (or replace) a user's SCRAM credential in a stopped broker's metadata log.
    Add(ScramAddArgs),
}

pub fn run(command: ScramCommand) -> anyhow::Result<()> {
    match command {
        ScramCommand::Add(args) => add(&args),
    }
}

fn add(args: &ScramAddArgs) -> anyhow::Result<()> {
    let mechanism = ScramMechanism::from_name(&args.mechanism).ok_or_else(|| {
        anyhow::anyhow!(
            "--mechanism {}: expected SCRAM-SHA-256 or SCRAM-SHA-512",
            args.mechanism
        )
    })?;
    anyhow::ensure!(!args.user.is_empty(), "--user must not be empty");
    anyhow::ensure!(!args.password.is_empty(), "--password must not be empty");
    anyhow::ensure!(
        (ITERATIONS_MIN..=ITERATIONS_MAX).contains(&args.iterations),
        "--iterations must be between {ITERATIONS_MIN} and {ITERATIONS_MAX}"
    );
    std::fs::create_dir_all(&args.data_dir)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", args.data_dir.display()))?;
    let _lock = store::lock_data_dir(&args.data_dir).map_err(|e| {
        if e.kind() == std::io::ErrorKind::WouldBlock {
            anyhow::anyhow!(
                "data dir {} is in use: stop the broker first (or add the user with kafka-configs against it)",
                args.data_dir.display()
            )
        } else {
            anyhow::anyhow!("cannot lock {}: {e}", args.data_dir.display())
        }
    })?;
    // A damaged log is refused here as at the broker's start (and an old
    // `metadata.log` is migrated first, as the broker would).
    let (mut log, _) = store::MetadataLog::open(&args.data_dir)?;
    let record = MetadataRecord::UserScramCredential {
        name: args.user.clone(),
        mechanism: mechanism.type_id(),
        credential: mechanism.new_credential(&args.password, args.iterations),
    };
    log.append(&[record])?;
    println!(
        "fjord: added {} credential for User:{} ({} iterations) to {}",
        mechanism.name(),
        args.user,
        args.iterations,
        log.path().display()
    );
    Ok(())
}

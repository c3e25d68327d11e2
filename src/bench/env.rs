//! The environment a result was measured in (CPU model, cores, kernel, commit,
//! host), so that every number can name its machine and commit.
//!
//! Read once per run by the main thread; plain data, no shared state.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Environment {
    pub cpu_model: String,
    pub cpus_online: usize,
    pub kernel: String,
    pub hostname: String,
    /// `git rev-parse --short HEAD` of the working directory, with `-dirty` when it has changes.
    pub commit: String,
    pub fjord_version: String,
    /// Seconds since the Unix epoch when the run ended.
    pub timestamp_s: u64,
}

impl Environment {
    pub fn detect() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "unknown".to_string());
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".to_string())
        };
        Environment {
            cpu_model,
            cpus_online: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            kernel: read("/proc/sys/kernel/osrelease"),
            hostname: read("/proc/sys/kernel/hostname"),
            commit: git_commit(),
            fjord_version: env!("CARGO_PKG_VERSION").to_string(),
            timestamp_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        }
    }
}

/// The commit of the current directory's git work tree, or `unknown`.
pub fn git_commit() -> String {
    let run = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match run(&["rev-parse", "--short", "HEAD"]) {
        Some(c) => {
            let dirty = run(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{c}-dirty")
            } else {
                c
            }
        }
        None => "unknown".to_string(),
    }
}

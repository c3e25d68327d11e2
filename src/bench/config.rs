//! Bench settings: the command-line flags, the workload file (TOML, same keys
//! as the long flags), and the resolved [`BenchConfig`] that a run uses.
//!
//! Invariant: a flag given on the command line always wins over the workload
//! file, and the file wins over the built-in default, so a shipped workload can
//! be re-run with one setting changed (`--rate 20000`). Resolution happens once,
//! before any client exists; nothing here is shared between threads except the
//! immutable resolved config.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::BenchError;

/// Smallest message the bench can send: the first 8 bytes of every payload
/// carry the send time (nanoseconds on the bench's clock) for end-to-end latency.
pub const MESSAGE_SIZE_MIN_BYTES: usize = 8;

/// Key distribution of produced messages (OMB's `keyDistributor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum KeyMode {
    /// No key: librdkafka's sticky partitioner spreads batches.
    None,
    /// Keys `0, 1, 2, ...` cycling over the partition count.
    RoundRobin,
    /// A random 8-byte key per message.
    Random,
}

/// `fjord bench`'s flags. Every one is optional so that a workload file can
/// supply it; see [`BenchConfig::resolve`] for the defaults.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct BenchArgs {
    /// Workload file (TOML; keys are the long flag names, e.g. `message-size = 1024`).
    #[arg(long, short = 'w')]
    pub workload: Option<PathBuf>,
    /// Name of the workload in the result (default: the file stem, or "custom").
    #[arg(long)]
    pub name: Option<String>,
    /// Label of the broker under test in the result and report (e.g. "fjord", "tansu").
    #[arg(long)]
    pub label: Option<String>,
    /// Kafka bootstrap servers.
    #[arg(long)]
    pub bootstrap: Option<String>,
    /// Topic to use (created if missing; default: a fresh `bench-<time>` topic).
    #[arg(long)]
    pub topic: Option<String>,
    /// Partitions of the topic when it is created.
    #[arg(long)]
    pub partitions: Option<i32>,
    /// Payload bytes per message (at least 8).
    #[arg(long)]
    pub message_size: Option<usize>,
    /// Target publish rate in messages per second over all producers; 0 = find the maximum sustainable rate.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Measured duration (e.g. `60s`, `2m`, `500ms`).
    #[arg(long)]
    pub duration: Option<String>,
    /// Warm-up before measuring (not recorded).
    #[arg(long)]
    pub warmup: Option<String>,
    /// Producer clients (one thread each).
    #[arg(long)]
    pub producers: Option<usize>,
    /// Consumer clients (one thread each; partitions are split between them). 0 = no end-to-end latency.
    #[arg(long)]
    pub consumers: Option<usize>,
    /// Consumers start this long after the producers (backlog-drain workloads).
    #[arg(long)]
    pub consumer_delay: Option<String>,
    /// Producer `acks`: 0, 1 or all.
    #[arg(long)]
    pub acks: Option<String>,
    /// Producer `linger.ms`.
    #[arg(long)]
    pub linger_ms: Option<u64>,
    /// Producer `batch.size` in bytes.
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Producer `compression.type`: none, gzip, snappy, lz4, zstd.
    #[arg(long)]
    pub compression: Option<String>,
    /// Message keys.
    #[arg(long, value_enum)]
    pub keys: Option<KeyMode>,
    /// Idempotent producers (`enable.idempotence=true`).
    #[arg(long)]
    pub idempotence: Option<bool>,
    /// Transactional producers committing every N ms (0 = not transactional).
    #[arg(long)]
    pub transaction_duration_ms: Option<u64>,
    /// Directory for the JSON result (default: print only).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Shell command that starts the broker for this run; it is stopped at the end.
    /// Its CPU seconds and peak RSS go into the result.
    #[arg(long)]
    pub broker_cmd: Option<String>,
    /// How long the `--broker-cmd` broker may take to accept connections
    /// (e.g. `120s` for a JVM broker on a busy machine) [default: 30s].
    #[arg(long)]
    pub broker_start_timeout: Option<String>,
    /// Pid of an already running broker whose CPU seconds and peak RSS are recorded.
    #[arg(long)]
    pub broker_pid: Option<u32>,
    /// CPU list the bench's threads (and librdkafka's) may run on, e.g. `1` or `0,1`.
    #[arg(long)]
    pub client_cores: Option<String>,
    /// Extra librdkafka properties `key=value` for every client of the run
    /// (repeatable): the admin client that creates the topic, the set-up
    /// consumer, the producers and the consumers, e.g. the security settings
    /// `security.protocol=SASL_SSL`. `--producer-config` and
    /// `--consumer-config` come after these, so theirs win.
    #[arg(long = "client-config")]
    pub client_config: Vec<String>,
    /// Extra librdkafka producer properties `key=value` (repeatable).
    #[arg(long = "producer-config")]
    pub producer_config: Vec<String>,
    /// Extra librdkafka consumer properties `key=value` (repeatable), e.g.
    /// `max.partition.fetch.bytes=16777216`.
    #[arg(long = "consumer-config")]
    pub consumer_config: Vec<String>,
    /// Seconds between status lines, which are also the windows of the
    /// series over time in the result [default: 1; 10 before, which left a
    /// 30 s run three points and hid stalls].
    #[arg(long)]
    pub status_interval_secs: Option<u64>,
}

/// Seconds between status lines and points of the series over time.
pub const STATUS_INTERVAL_SECS_DEFAULT: u64 = 1;

/// The workload file: the same settings as the flags.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct WorkloadFile {
    pub name: Option<String>,
    pub description: Option<String>,
    pub bootstrap: Option<String>,
    pub topic: Option<String>,
    pub partitions: Option<i32>,
    pub message_size: Option<usize>,
    pub rate: Option<f64>,
    pub duration: Option<String>,
    pub warmup: Option<String>,
    pub producers: Option<usize>,
    pub consumers: Option<usize>,
    pub consumer_delay: Option<String>,
    pub acks: Option<String>,
    pub linger_ms: Option<u64>,
    pub batch_size: Option<usize>,
    pub compression: Option<String>,
    pub keys: Option<KeyMode>,
    pub idempotence: Option<bool>,
    pub transaction_duration_ms: Option<u64>,
    #[serde(default)]
    pub client_config: Vec<String>,
    #[serde(default)]
    pub producer_config: Vec<String>,
    #[serde(default)]
    pub consumer_config: Vec<String>,
}

impl WorkloadFile {
    pub fn load(path: &Path) -> Result<Self, BenchError> {
        let text = std::fs::read_to_string(path).map_err(|source| BenchError::Io {
            what: format!("reading workload {}", path.display()),
            source,
        })?;
        toml::from_str(&text).map_err(|e| BenchError::Config(format!("{}: {e}", path.display())))
    }
}

/// Client properties `key=value` from the workload file, then the flags
/// (`what` names the setting in errors); later ones win in librdkafka.
fn properties(
    what: &str,
    from_file: &[String],
    from_flags: &[String],
) -> Result<Vec<(String, String)>, BenchError> {
    from_file
        .iter()
        .chain(from_flags)
        .map(|kv| {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| BenchError::Config(format!("{what} `{kv}`: want key=value")))?;
            Ok((k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

/// Everything a run needs, resolved from flags, file and defaults.
#[derive(Debug, Clone, Serialize)]
pub struct BenchConfig {
    pub name: String,
    pub description: String,
    pub label: String,
    pub bootstrap: String,
    pub topic: String,
    pub partitions: i32,
    pub message_size: usize,
    /// Messages per second over all producers; 0 = search for the maximum.
    pub rate: f64,
    #[serde(serialize_with = "ser_duration_s")]
    pub duration: Duration,
    #[serde(serialize_with = "ser_duration_s")]
    pub warmup: Duration,
    pub producers: usize,
    pub consumers: usize,
    #[serde(serialize_with = "ser_duration_s")]
    pub consumer_delay: Duration,
    pub acks: String,
    pub linger_ms: u64,
    pub batch_size: usize,
    pub compression: String,
    pub keys: KeyMode,
    pub idempotence: bool,
    pub transaction_duration_ms: u64,
    /// Properties of every client (admin, set-up consumer, producers,
    /// consumers); recorded in the result without the values of keys that
    /// name secrets (see [`redacted`]).
    #[serde(serialize_with = "ser_redacted")]
    pub client_config: Vec<(String, String)>,
    #[serde(serialize_with = "ser_redacted")]
    pub producer_config: Vec<(String, String)>,
    #[serde(serialize_with = "ser_redacted")]
    pub consumer_config: Vec<(String, String)>,
    #[serde(skip)]
    pub output: Option<PathBuf>,
    #[serde(skip)]
    pub broker_cmd: Option<String>,
    #[serde(skip)]
    pub broker_start_timeout: Duration,
    #[serde(skip)]
    pub broker_pid: Option<u32>,
    pub client_cores: Vec<usize>,
    #[serde(serialize_with = "ser_duration_s")]
    pub status_interval: Duration,
}

/// Whether a client property's value is a secret that a result file must
/// not hold (`sasl.password`, `ssl.key.password`, ...).
pub fn is_secret(key: &str) -> bool {
    key.contains("password") || key.contains("secret") || key.ends_with(".pem")
}

/// `props` with the values of secret keys ([`is_secret`]) replaced.
pub fn redacted(props: &[(String, String)]) -> Vec<(String, String)> {
    props
        .iter()
        .map(|(k, v)| {
            let v = if is_secret(k) { "[redacted]" } else { v };
            (k.clone(), v.to_string())
        })
        .collect()
}

fn ser_redacted<S: serde::Serializer>(props: &[(String, String)], s: S) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&redacted(props), s)
}

fn ser_duration_s<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl BenchConfig {
    /// Merges flags over the workload file over the defaults, and checks the result.
    pub fn resolve(args: &BenchArgs) -> Result<Self, BenchError> {
        let file = match &args.workload {
            Some(p) => WorkloadFile::load(p)?,
            None => WorkloadFile::default(),
        };
        let stem = args
            .workload
            .as_ref()
            .and_then(|p| p.file_stem())
            .map(|s| s.to_string_lossy().into_owned());
        let name = args
            .name
            .clone()
            .or(file.name.clone())
            .or(stem)
            .unwrap_or_else(|| "custom".to_string());
        let now_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let client_config = properties("client-config", &file.client_config, &args.client_config)?;
        let producer_config = properties(
            "producer-config",
            &file.producer_config,
            &args.producer_config,
        )?;
        let consumer_config = properties(
            "consumer-config",
            &file.consumer_config,
            &args.consumer_config,
        )?;
        let cfg = BenchConfig {
            description: file.description.clone().unwrap_or_default(),
            label: args.label.clone().unwrap_or_else(|| "broker".to_string()),
            bootstrap: pick(
                &args.bootstrap,
                &file.bootstrap,
                "127.0.0.1:9092".to_string(),
            ),
            topic: pick(&args.topic, &file.topic, format!("bench-{name}-{now_s}")),
            partitions: pick(&args.partitions, &file.partitions, 1),
            message_size: pick(&args.message_size, &file.message_size, 1024),
            rate: pick(&args.rate, &file.rate, 1000.0),
            duration: parse_duration(&pick(&args.duration, &file.duration, "60s".to_string()))?,
            warmup: parse_duration(&pick(&args.warmup, &file.warmup, "10s".to_string()))?,
            producers: pick(&args.producers, &file.producers, 1),
            consumers: pick(&args.consumers, &file.consumers, 1),
            consumer_delay: parse_duration(&pick(
                &args.consumer_delay,
                &file.consumer_delay,
                "0s".to_string(),
            ))?,
            acks: pick(&args.acks, &file.acks, "all".to_string()),
            linger_ms: pick(&args.linger_ms, &file.linger_ms, 1),
            batch_size: pick(&args.batch_size, &file.batch_size, 131_072),
            compression: pick(&args.compression, &file.compression, "none".to_string()),
            keys: pick(&args.keys, &file.keys, KeyMode::None),
            idempotence: pick(&args.idempotence, &file.idempotence, false),
            transaction_duration_ms: pick(
                &args.transaction_duration_ms,
                &file.transaction_duration_ms,
                0,
            ),
            client_config,
            producer_config,
            consumer_config,
            output: args.output.clone(),
            broker_cmd: args.broker_cmd.clone(),
            broker_start_timeout: match &args.broker_start_timeout {
                Some(t) => parse_duration(t)?,
                None => Duration::from_millis(super::broker::BROKER_START_TIMEOUT_MS),
            },
            broker_pid: args.broker_pid,
            client_cores: match &args.client_cores {
                Some(s) => parse_cpu_list(s)?,
                None => Vec::new(),
            },
            status_interval: Duration::from_secs(
                args.status_interval_secs
                    .unwrap_or(STATUS_INTERVAL_SECS_DEFAULT)
                    .max(1),
            ),
            name,
        };
        cfg.check()?;
        Ok(cfg)
    }

    fn check(&self) -> Result<(), BenchError> {
        let bad = |m: String| Err(BenchError::Config(m));
        if self.message_size < MESSAGE_SIZE_MIN_BYTES {
            return bad(format!(
                "message-size {} < {MESSAGE_SIZE_MIN_BYTES} (the send time is embedded)",
                self.message_size
            ));
        }
        if self.partitions < 1 {
            return bad(format!("partitions {} < 1", self.partitions));
        }
        if self.producers < 1 {
            return bad("producers must be at least 1".to_string());
        }
        if !(self.rate >= 0.0 && self.rate.is_finite()) {
            return bad(format!("rate {} is not a non-negative number", self.rate));
        }
        if !matches!(self.acks.as_str(), "0" | "1" | "all" | "-1") {
            return bad(format!("acks {} (want 0, 1 or all)", self.acks));
        }
        if self.duration.is_zero() {
            return bad("duration must be positive".to_string());
        }
        if self.transaction_duration_ms > 0 && self.acks != "all" && self.acks != "-1" {
            return bad("transactions need acks=all".to_string());
        }
        Ok(())
    }

    /// Total bytes per message on the wire's value side, as MB/s is computed (payload only, like OMB).
    pub fn mb_per_msg(&self) -> f64 {
        self.message_size as f64 / (1024.0 * 1024.0)
    }
}

fn pick<T: Clone>(flag: &Option<T>, file: &Option<T>, default: T) -> T {
    flag.clone().or_else(|| file.clone()).unwrap_or(default)
}

/// Parses `10s`, `2m`, `500ms`, `1h` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, BenchError> {
    let s = s.trim();
    let err = || BenchError::Config(format!("duration `{s}`: want e.g. 10s, 2m, 500ms"));
    let (num, unit_ms) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1_000.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3_600_000.0)
    } else {
        (s, 1_000.0)
    };
    let v: f64 = num.trim().parse().map_err(|_| err())?;
    if !(v >= 0.0 && v.is_finite()) {
        return Err(err());
    }
    Ok(Duration::from_secs_f64(v * unit_ms / 1_000.0))
}

/// Parses a CPU list like `0,2-3`.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, BenchError> {
    let err = || BenchError::Config(format!("cpu list `{s}`: want e.g. 1 or 0,2-3"));
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some((a, b)) = part.split_once('-') {
            let a: usize = a.parse().map_err(|_| err())?;
            let b: usize = b.parse().map_err(|_| err())?;
            if a > b {
                return Err(err());
            }
            out.extend(a..=b);
        } else {
            out.push(part.parse().map_err(|_| err())?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("fast").is_err());
    }

    #[test]
    fn cpu_lists_parse_ranges() {
        assert_eq!(parse_cpu_list("0,2-3").unwrap(), vec![0, 2, 3]);
        assert!(parse_cpu_list("3-1").is_err());
    }

    #[test]
    fn flags_override_workload_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.toml");
        std::fs::write(&p, "message-size = 100\nrate = 10000\npartitions = 4\n").unwrap();
        let args = BenchArgs {
            workload: Some(p),
            rate: Some(5.0),
            ..Default::default()
        };
        let c = BenchConfig::resolve(&args).unwrap();
        assert_eq!(c.message_size, 100);
        assert_eq!(c.partitions, 4);
        assert_eq!(c.rate, 5.0);
        assert_eq!(c.name, "w");
        assert_eq!(c.broker_start_timeout, Duration::from_secs(30));
        let args = BenchArgs {
            broker_start_timeout: Some("2m".into()),
            ..args
        };
        let c = BenchConfig::resolve(&args).unwrap();
        assert_eq!(c.broker_start_timeout, Duration::from_secs(120));
    }

    #[test]
    fn client_properties_come_from_file_then_flags() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.toml");
        std::fs::write(
            &p,
            "consumer-config = [\"fetch.max.bytes = 1000\"]\nproducer-config = [\"linger.ms=3\"]\n",
        )
        .unwrap();
        let args = BenchArgs {
            workload: Some(p),
            consumer_config: vec!["max.partition.fetch.bytes=2000".into()],
            ..Default::default()
        };
        let c = BenchConfig::resolve(&args).unwrap();
        let kv = |k: &str, v: &str| (k.to_string(), v.to_string());
        assert_eq!(
            c.consumer_config,
            [
                kv("fetch.max.bytes", "1000"),
                kv("max.partition.fetch.bytes", "2000")
            ]
        );
        assert_eq!(c.producer_config, [kv("linger.ms", "3")]);
        let bad = BenchArgs {
            consumer_config: vec!["no-equals".into()],
            ..Default::default()
        };
        let e = BenchConfig::resolve(&bad).unwrap_err().to_string();
        assert!(e.contains("consumer-config `no-equals`"), "{e}");
    }

    #[test]
    fn client_config_applies_to_all_and_its_secrets_are_not_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.toml");
        std::fs::write(&p, "client-config = [\"security.protocol=SASL_SSL\"]\n").unwrap();
        let args = BenchArgs {
            workload: Some(p),
            client_config: vec!["sasl.password=hunter2".into(), "sasl.username=bench".into()],
            producer_config: vec!["ssl.key.password=k3y".into()],
            ..Default::default()
        };
        let c = BenchConfig::resolve(&args).unwrap();
        let kv = |k: &str, v: &str| (k.to_string(), v.to_string());
        assert_eq!(
            c.client_config,
            [
                kv("security.protocol", "SASL_SSL"),
                kv("sasl.password", "hunter2"),
                kv("sasl.username", "bench")
            ]
        );
        let json = serde_json::to_string(&c).unwrap();
        assert!(!json.contains("hunter2") && !json.contains("k3y"), "{json}");
        assert!(
            json.contains("SASL_SSL") && json.contains("[redacted]"),
            "{json}"
        );
    }

    #[test]
    fn shipped_workloads_resolve() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "toml") {
                let args = BenchArgs {
                    workload: Some(p.clone()),
                    ..Default::default()
                };
                let c =
                    BenchConfig::resolve(&args).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                assert!(
                    !c.description.is_empty(),
                    "{} has no description",
                    p.display()
                );
                n += 1;
            }
        }
        assert!(n >= 8, "only {n} workloads shipped");
    }

    #[test]
    fn unknown_workload_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.toml");
        std::fs::write(&p, "mesage-size = 100\n").unwrap();
        let args = BenchArgs {
            workload: Some(p),
            ..Default::default()
        };
        assert!(BenchConfig::resolve(&args).is_err());
    }
}

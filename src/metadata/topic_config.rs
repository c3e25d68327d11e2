//! Topic configs: every key of Kafka 4.4's topic config (`LogConfig`), its
//! default (from the broker config, as Kafka derives `retention.ms` from
//! `log.retention.ms`), its validation (Kafka's validators, error texts
//! included), and the resolved [`TopicConfig`] a partition runs with.
//!
//! Every key Kafka 4.4 accepts is accepted, stored and described, because
//! topic-management tools (Terraform, Strimzi, Cruise Control, Connect's
//! and Streams' topic creation) set keys such as
//! `unclean.leader.election.enable` or the replication throttles and fail
//! when a broker refuses them. Each key's [`Effect`] says whether fjord
//! applies it, whether it cannot matter on a single node with one replica
//! per partition, or whether it is stored without being applied yet; the
//! DescribeConfigs documentation of the key says the same, and
//! `docs/topic-configs.md` lists them. A key Kafka 4.4 does not know
//! (including the ones Kafka 4.0 removed, such as
//! `message.downconversion.enable` and `message.format.version`) is refused
//! with INVALID_CONFIG, as Kafka refuses it.
//!
//! Compaction (issue 26): `cleanup.policy` takes `delete`, `compact` or both
//! (a comma-separated list, as Kafka's `ValidList`), and the cleaner's topic
//! configs (`min.cleanable.dirty.ratio`, `min.compaction.lag.ms`,
//! `max.compaction.lag.ms`, `delete.retention.ms`) are validated and
//! described with Kafka's names, defaults and broker synonyms. What takes
//! effect today: a topic whose policy lacks `delete` is never deleted by
//! retention (Kafka's `UnifiedLog.deleteOldSegments`), DeleteRecords on it
//! gets POLICY_VIOLATION, and a produce of a record without a key to a topic
//! whose policy has `compact` gets INVALID_RECORD (Kafka's
//! `LogValidator.validateKey`), and the log cleaner
//! (`partition::compaction`, `log::compact`) cleans it.

use crate::config::BrokerConfig;
use crate::record::Compression;
use std::collections::BTreeMap;

/// Why a topic config change was refused (mapped to INVALID_CONFIG).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("Unknown topic config name: {0}")]
    UnknownKey(String),
    #[error("Invalid value {value} for configuration {key}: {reason}")]
    InvalidValue {
        key: String,
        value: String,
        reason: String,
    },
    /// Two configs that are each valid contradict each other.
    #[error("{0}")]
    Conflict(String),
    /// A valid value this broker cannot serve, with Kafka's message.
    #[error("{0}")]
    Refused(String),
}

/// The type Kafka reports for a config in DescribeConfigs v3+.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigType {
    Boolean = 1,
    String = 2,
    Int = 3,
    Short = 4,
    Long = 5,
    Double = 6,
    List = 7,
    Class = 8,
    Password = 9,
}

/// What setting a key does in fjord.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Applied as Kafka applies it.
    Applied,
    /// About replicas, leader elections or tiered storage: nothing to do on
    /// a single node where each partition has one replica and no remote
    /// tier. Stored and described.
    SingleNode,
    /// Stored and described, not applied yet (the doc says what fjord
    /// does instead).
    NotApplied,
}

/// One supported key: name, type, its default given the broker config, and
/// what it does in fjord.
pub struct ConfigKey {
    pub name: &'static str,
    pub kind: ConfigType,
    pub default: fn(&BrokerConfig) -> String,
    pub doc: &'static str,
    pub effect: Effect,
}

const FOREVER: i64 = i64::MAX;

/// The topic configs fjord implements, in the order DescribeConfigs lists them.
pub const KEYS: &[ConfigKey] = &[
    ConfigKey {
        name: "cleanup.policy",
        kind: ConfigType::List,
        default: |_| CLEANUP_POLICY_DELETE.into(),
        doc: "'delete' removes whole segments by retention; 'compact' keeps the latest record per key (the log cleaner); 'compact,delete' both.",
        effect: Effect::Applied,
    },
    ConfigKey {
        name: "compression.gzip.level",
        kind: ConfigType::Int,
        default: |_| "-1".into(),
        doc: "Stored, not applied: fjord recompresses gzip at its codec default level.",
        effect: Effect::NotApplied,
    },
    ConfigKey {
        name: "compression.lz4.level",
        kind: ConfigType::Int,
        default: |_| "9".into(),
        doc: "Stored, not applied: fjord recompresses lz4 at its codec default level.",
        effect: Effect::NotApplied,
    },
    ConfigKey {
        name: "compression.type",
        kind: ConfigType::String,
        default: |_| "producer".into(),
        doc: "'producer' keeps the producer's codec; a codec name recompresses to it.",
        effect: Effect::Applied,
    },
    ConfigKey {
        name: "compression.zstd.level",
        kind: ConfigType::Int,
        default: |_| "3".into(),
        doc: "Stored, not applied: fjord recompresses zstd at its codec default level.",
        effect: Effect::NotApplied,
    },
    ConfigKey {
        name: "delete.retention.ms",
        kind: ConfigType::Long,
        default: |b| b.log_cleaner_delete_retention_ms.to_string(),
        doc: "How long a tombstone of a compacted topic is kept after the cleaning that first saw it.",
        effect: Effect::Applied,
    },
    ConfigKey {
        name: "errors.deadletterqueue.group.enable",
        kind: ConfigType::Boolean,
        default: |_| "false".into(),
        doc: "Stored, not applied: fjord has no share groups, whose dead-letter queue this enables.",
        effect: Effect::NotApplied,
    },
    ConfigKey {
        name: "file.delete.delay.ms",
        kind: ConfigType::Long,
        default: |_| "60000".into(),
        doc: "Stored, not applied: fjord deletes a segment file when retention removes it, without delay.",
        effect: Effect::NotApplied,
    },
    ConfigKey {
        name: "flush.messages",
        kind: ConfigType::Long,
        default: |_| FOREVER.to_string(),
        doc: "fdatasync after this many messages.",
        effect: Effect::Applied,
    },
    ConfigKey {
        name: "flush.ms",
        kind: ConfigType::Long,
        default: |_| FOREVER.to_string(),
        doc: "fdatasync at least this often.",
        effect: Effect::Applied,
    },
    ConfigKey {
        name: "follower.replication.throttled.replicas",
        kind: ConfigType::List,
        default: |_| String::new(),
        doc: "No effect on a single node: there are no followers to throttle.",
        effect: Effect::SingleNode,
    },
    ConfigKey {
        name: "index.interval.bytes",
        kind: ConfigType::Int,
        default: |_| "4096".into(),
        doc: "Bytes appended between offset index entries.",
        effect: Effect::Applied,
    },
    ConfigKey {
        name: "leader.replication.throttled.replicas",
        kind: ConfigType::List,
        default: |_| String::new(),
        doc: "No effect on a single node: there are no followers to throttle.",
        effect: Effect::SingleNode,
    },
    ConfigKey {
        name: "local.retention.bytes",
        kind: ConfigType::Long,
        default: |_| "-2".into(),
        doc: "No effect without tiered storage: the whole log is local (-2 = retention.bytes).",
        effect: Effect::SingleNode,
    },
    ConfigKey {
        name: "local.retention.ms",
        kind: ConfigType::Long,
        default: |_| "-2".into(),
        doc: "No effect without tiered storage: the whole log is local (-2 = retention.ms).",
        effect: Effect::SingleNode,
    },
    ConfigKey {
        name: "max.compaction.lag.ms",
        kind: ConfigType::Long,
        default: |b| b.log_cleaner_max_compaction_lag_ms.to_string(),
        doc: "Longest a record may stay uncompacted in a compacted topic.",
        effect: Effect::Applied,
    },
    ConfigKey {
        name: "max.decompressed.message.bytes",
        kind: ConfigType::Int,
        default: |_| "2147483639".into(),
        doc: "Stored, not applied: fjord bounds what a recompressed batch may decompress to with --batch-decompressed-bytes-max.",
        effect: Effect::NotApplied,
    },
    ConfigKey {
        name: "max.message.bytes",
        kind: ConfigType::Int,
        default: |b| b.message_max_bytes.to_string(),
        doc: "Largest record batch accepted.",
        effect: Effect::Applied,
    },
    ConfigKey {
        name: "message.timestamp.after.max.ms",
        kind: ConfigType::Long,
        default: |_| "3600000".into(),
        doc: "Stored, not applied: fjord does not refuse batches timestamped in the future.",
        effect: Effect::NotApplied,
    },
    ConfigKey {
        name: "message.timestamp.before.max.ms",
        kind: ConfigType::Long,
        default: |_| FOREVER.to_string(),
        doc: "Stored, not applied: fjord does not refuse batches timestamped in the past.",
        effect: Effect::NotApplied,
    },
    ConfigKey {
        name: "message.timestamp.type",
        kind: ConfigType::String,
        default: |_| "CreateTime".into(),
        doc: "CreateTime keeps the producer's timestamps; LogAppendTime sets the broker's.",
        effect: Effect::Applied,
    },
    ConfigKey {
        name: "min.cleanable.dirty.ratio",
        kind: ConfigType::Double,
        default: |b| format_double(b.log_cleaner_min_cleanable_ratio),
        doc: "Share of a compacted log not yet cleaned above which the cleaner takes it.",
        effect: Effect::Applied,
    },
    ConfigKey {
        name: "min.compaction.lag.ms",
        kind: ConfigType::Long,
        default: |b| b.log_cleaner_min_compaction_lag_ms.to_string(),
        doc: "Shortest time a record stays uncompacted in a compacted topic.",
        effect: Effect::Applied,
    },
    ConfigKey {
        name: "min.insync.replicas",
        kind: ConfigType::Int,
        default: |_| "1".into(),
        doc: "Effective value is min(this, replicas) = 1 on one node.",
        effect: Effect::Applied,
    },
    ConfigKey {
        name: "preallocate",
        kind: ConfigType::Boolean,
        default: |_| "false".into(),
        doc: "Stored, not applied: fjord always grows segment files by fallocate in steps.",
        effect: Effect::NotApplied,
    },
    ConfigKey {
        name: "remote.copy.lag.bytes",
        kind: ConfigType::Long,
        default: |_| "-1".into(),
        doc: "No effect without tiered storage.",
        effect: Effect::SingleNode,
    },
    ConfigKey {
        name: "remote.copy.lag.ms",
        kind: ConfigType::Long,
        default: |_| "0".into(),
        doc: "No effect without tiered storage.",
        effect: Effect::SingleNode,
    },
    ConfigKey {
        name: "remote.log.copy.disable",
        kind: ConfigType::Boolean,
        default: |_| "false".into(),
        doc: "No effect without tiered storage.",
        effect: Effect::SingleNode,
    },
    ConfigKey {
        name: "remote.log.delete.on.disable",
        kind: ConfigType::Boolean,
        default: |_| "false".into(),
        doc: "No effect without tiered storage.",
        effect: Effect::SingleNode,
    },
    ConfigKey {
        name: "remote.storage.enable",
        kind: ConfigType::Boolean,
        default: |_| "false".into(),
        doc: "Tiered storage; fjord has none, so only false is accepted (as Kafka without remote.log.storage.system.enable).",
        effect: Effect::SingleNode,
    },
    ConfigKey {
        name: "retention.bytes",
        kind: ConfigType::Long,
        default: |_| "-1".into(),
        doc: "Delete old segments beyond this size per partition; -1 = no limit.",
        effect: Effect::Applied,
    },
    ConfigKey {
        name: "retention.ms",
        kind: ConfigType::Long,
        default: |b| b.log_retention_ms.to_string(),
        doc: "Delete segments older than this; -1 = keep forever.",
        effect: Effect::Applied,
    },
    ConfigKey {
        name: "segment.bytes",
        kind: ConfigType::Int,
        default: |b| b.log_segment_bytes.to_string(),
        doc: "Roll to a new segment at this size.",
        effect: Effect::Applied,
    },
    ConfigKey {
        name: "segment.index.bytes",
        kind: ConfigType::Int,
        default: |_| (10 * 1024 * 1024).to_string(),
        doc: "Maximum size of an offset or time index file.",
        effect: Effect::Applied,
    },
    ConfigKey {
        name: "segment.jitter.ms",
        kind: ConfigType::Long,
        default: |_| "0".into(),
        doc: "Stored, not applied: segments roll at segment.ms without jitter.",
        effect: Effect::NotApplied,
    },
    ConfigKey {
        name: "segment.ms",
        kind: ConfigType::Long,
        default: |_| (7i64 * 24 * 60 * 60 * 1000).to_string(),
        doc: "Roll to a new segment after this long.",
        effect: Effect::Applied,
    },
    ConfigKey {
        name: "unclean.leader.election.enable",
        kind: ConfigType::Boolean,
        default: |_| "false".into(),
        doc: "Several nodes: when no live replica of a partition is in its ISR or ELR, elect the first live replica anyway (acknowledged writes it lacks are lost). No effect on one node: the only replica is always the leader.",
        effect: Effect::Applied,
    },
];

/// Kafka's `cleanup.policy` values.
pub const CLEANUP_POLICY_DELETE: &str = "delete";
pub const CLEANUP_POLICY_COMPACT: &str = "compact";

/// How Java's `Double.toString` writes the ratios fjord uses (`0.5`, `1.0`,
/// `0.0`): DescribeConfigs shows a double the way Kafka does.
pub fn format_double(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e7 {
        format!("{v:.1}")
    } else {
        v.to_string()
    }
}

/// Parses a `cleanup.policy` value as Kafka's `ValidList` does: a
/// comma-separated list, each item trimmed, every item `delete` or
/// `compact`. Returns (delete, compact).
pub fn parse_cleanup_policy(value: &str) -> Result<(bool, bool), ConfigError> {
    let key = "cleanup.policy";
    let (mut delete, mut compact) = (false, false);
    // Kafka 4.4 accepts an empty list: neither deleted nor compacted.
    if value.trim().is_empty() {
        return Ok((false, false));
    }
    for item in value.split(',').map(str::trim) {
        match item {
            CLEANUP_POLICY_DELETE => delete = true,
            CLEANUP_POLICY_COMPACT => compact = true,
            _ => {
                return Err(invalid(
                    key,
                    value,
                    "String must be one of: compact, delete",
                ))
            }
        }
    }
    Ok((delete, compact))
}

pub use crate::config::SEGMENT_BYTES_MIN;

fn invalid(key: &str, value: &str, reason: &str) -> ConfigError {
    ConfigError::InvalidValue {
        key: key.into(),
        value: value.into(),
        reason: reason.into(),
    }
}

fn parse_long(key: &str, value: &str, min: i64) -> Result<i64, ConfigError> {
    let v: i64 = value
        .trim()
        .parse()
        .map_err(|_| invalid(key, value, "Not a number of type LONG"))?;
    at_least(key, value, v, min)
}

fn parse_int(key: &str, value: &str, min: i64) -> Result<i64, ConfigError> {
    let v: i32 = value
        .trim()
        .parse()
        .map_err(|_| invalid(key, value, "Not a number of type INT"))?;
    at_least(key, value, v as i64, min)
}

/// Kafka's `ConfigDef.Range.atLeast`.
fn at_least(key: &str, value: &str, v: i64, min: i64) -> Result<i64, ConfigError> {
    if v < min {
        return Err(invalid(
            key,
            value,
            &format!("Value must be at least {min}"),
        ));
    }
    Ok(v)
}

/// Kafka's `ConfigDef.Range.between`, for an INT.
fn int_between(key: &str, value: &str, min: i64, max: i64) -> Result<i64, ConfigError> {
    let v = parse_int(key, value, min)?;
    if v > max {
        return Err(invalid(
            key,
            value,
            &format!("Value must be no more than {max}"),
        ));
    }
    Ok(v)
}

/// Kafka's BOOLEAN parsing: `true` or `false` in any case, trimmed.
fn parse_bool(key: &str, value: &str) -> Result<bool, ConfigError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(invalid(
            key,
            value,
            "Expected value to be either true or false",
        )),
    }
}

/// Kafka's `ThrottledReplicaListValidator`: `*`, or a comma-separated list
/// of `partitionId:brokerId` (empty allowed). Its error names the value as
/// the list Kafka parsed it into.
fn validate_throttled_replicas(key: &str, value: &str) -> Result<(), ConfigError> {
    let items: Vec<&str> = value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let replica = |s: &str| {
        s.split_once(':')
            .is_some_and(|(p, b)| digits(p) && digits(b))
    };
    if items == ["*"] || items.iter().all(|s| replica(s)) {
        return Ok(());
    }
    Err(ConfigError::InvalidValue {
        key: key.into(),
        value: format!("[{}]", items.join(", ")),
        reason: format!(
            "{key} must be the literal '*' or a list of replicas in the following format: [partitionId]:[brokerId],[partitionId]:[brokerId],..."
        ),
    })
}

/// A double in [0, 1], as Kafka's `Range.between(0, 1)` for
/// `min.cleanable.dirty.ratio`.
fn parse_ratio(key: &str, value: &str) -> Result<f64, ConfigError> {
    let v: f64 = value
        .trim()
        .parse()
        .map_err(|_| invalid(key, value, "not a number"))?;
    // Kafka names the parsed double in its message ("-1.0").
    if !v.is_finite() || v < 0.0 {
        return Err(invalid(key, &format_double(v), "Value must be at least 0"));
    }
    if v > 1.0 {
        return Err(invalid(
            key,
            &format_double(v),
            "Value must be no more than 1",
        ));
    }
    Ok(v)
}

/// Checks one key/value pair as Kafka's `LogConfig.validate` would.
pub fn validate(key: &str, value: &str) -> Result<(), ConfigError> {
    match key {
        "cleanup.policy" => {
            parse_cleanup_policy(value)?;
        }
        "min.cleanable.dirty.ratio" => {
            parse_ratio(key, value)?;
        }
        "delete.retention.ms" | "min.compaction.lag.ms" => {
            parse_long(key, value, 0)?;
        }
        "max.compaction.lag.ms" => {
            parse_long(key, value, 1)?;
        }
        "compression.type" => {
            if value != "producer" && Compression::from_name(value).is_none() {
                return Err(invalid(
                    key,
                    value,
                    "must be one of producer, uncompressed, gzip, snappy, lz4, zstd",
                ));
            }
        }
        "message.timestamp.type" => {
            if value != "CreateTime" && value != "LogAppendTime" {
                return Err(invalid(key, value, "must be CreateTime or LogAppendTime"));
            }
        }
        "flush.messages" | "flush.ms" => {
            parse_long(key, value, 1)?;
        }
        "retention.ms" | "retention.bytes" => {
            parse_long(key, value, -1)?;
        }
        "segment.ms" => {
            parse_long(key, value, 1)?;
        }
        "segment.bytes" => {
            parse_int(key, value, SEGMENT_BYTES_MIN)?;
        }
        "segment.index.bytes" => {
            parse_int(key, value, 4096)?;
        }
        "index.interval.bytes" | "max.message.bytes" => {
            parse_int(key, value, 0)?;
        }
        "min.insync.replicas" | "max.decompressed.message.bytes" => {
            parse_int(key, value, 1)?;
        }
        "compression.gzip.level" => {
            let v: i32 = value
                .trim()
                .parse()
                .map_err(|_| invalid(key, value, "Not a number of type INT"))?;
            if v != -1 && !(1..=9).contains(&v) {
                return Err(invalid(
                    key,
                    value,
                    "Value must be between 1 and 9 or equal to -1",
                ));
            }
        }
        "compression.lz4.level" => {
            int_between(key, value, 1, 17)?;
        }
        "compression.zstd.level" => {
            int_between(key, value, -131072, 22)?;
        }
        "file.delete.delay.ms"
        | "message.timestamp.after.max.ms"
        | "message.timestamp.before.max.ms"
        | "segment.jitter.ms" => {
            parse_long(key, value, 0)?;
        }
        "local.retention.bytes" | "local.retention.ms" => {
            parse_long(key, value, -2)?;
        }
        "remote.copy.lag.bytes" | "remote.copy.lag.ms" => {
            parse_long(key, value, -1)?;
        }
        "errors.deadletterqueue.group.enable"
        | "preallocate"
        | "remote.log.copy.disable"
        | "remote.log.delete.on.disable"
        | "unclean.leader.election.enable" => {
            parse_bool(key, value)?;
        }
        "remote.storage.enable" => {
            if parse_bool(key, value)? {
                // Kafka's answer on a broker without
                // remote.log.storage.system.enable, which fjord has not.
                return Err(ConfigError::Refused(
                    "Tiered Storage functionality is disabled in the broker. Topic cannot be configured with remote log storage.".into(),
                ));
            }
        }
        "follower.replication.throttled.replicas" | "leader.replication.throttled.replicas" => {
            validate_throttled_replicas(key, value)?;
        }
        _ => return Err(ConfigError::UnknownKey(key.into())),
    }
    Ok(())
}

/// Overrides as Kafka stores them: a list value (`cleanup.policy`) is its
/// items trimmed and joined by commas, so `delete, compact` is described as
/// `delete,compact` (checked against stock Kafka 4.4).
pub fn normalized(mut configs: BTreeMap<String, String>) -> BTreeMap<String, String> {
    if let Some(v) = configs.get_mut("cleanup.policy") {
        let items: Vec<&str> = v
            .split(',')
            .map(str::trim)
            .filter(|i| !i.is_empty())
            .collect();
        *v = items.join(",");
    }
    configs
}

/// Validates a whole set of overrides, each key alone and then the pairs
/// Kafka's `LogConfig.validateValues` checks together, against the broker
/// defaults the topic falls back to.
pub fn validate_all(
    configs: &BTreeMap<String, String>,
    broker: &BrokerConfig,
) -> Result<(), ConfigError> {
    configs.iter().try_for_each(|(k, v)| validate(k, v))?;
    let c = TopicConfig::resolve(configs, broker);
    if c.min_compaction_lag_ms > c.max_compaction_lag_ms {
        return Err(ConfigError::Conflict(format!(
            "conflict topic config setting min.compaction.lag.ms ({}) > max.compaction.lag.ms ({})",
            c.min_compaction_lag_ms, c.max_compaction_lag_ms
        )));
    }
    Ok(())
}

/// The configs one partition runs with: overrides on top of broker defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct TopicConfig {
    /// `cleanup.policy` has `delete`: retention removes old segments.
    pub cleanup_delete: bool,
    /// `cleanup.policy` has `compact`: records need a key.
    pub cleanup_compact: bool,
    pub delete_retention_ms: i64,
    pub min_cleanable_dirty_ratio: f64,
    pub min_compaction_lag_ms: i64,
    pub max_compaction_lag_ms: i64,
    /// None = `producer` (keep the producer's codec).
    pub compression: Option<Compression>,
    pub flush_messages: i64,
    pub flush_ms: i64,
    pub index_interval_bytes: u32,
    pub max_message_bytes: i32,
    pub log_append_time: bool,
    pub min_insync_replicas: i32,
    /// `unclean.leader.election.enable` (several nodes; the controller's
    /// elections, `shard::controller`).
    pub unclean_leader_election: bool,
    pub retention_bytes: i64,
    pub retention_ms: i64,
    pub segment_bytes: u64,
    pub segment_index_bytes: u32,
    pub segment_ms: i64,
}

impl TopicConfig {
    /// Resolves `overrides` (already validated when they were stored) against
    /// the broker's defaults. A value that no longer parses falls back to the
    /// default rather than failing start-up.
    pub fn resolve(overrides: &BTreeMap<String, String>, broker: &BrokerConfig) -> TopicConfig {
        let get = |key: &str| -> String {
            match overrides.get(key) {
                Some(v) if validate(key, v).is_ok() => v.clone(),
                _ => KEYS
                    .iter()
                    .find(|k| k.name == key)
                    .map(|k| (k.default)(broker))
                    .unwrap_or_default(),
            }
        };
        let long = |key: &str| get(key).trim().parse::<i64>().unwrap_or(i64::MAX);
        let compression = match get("compression.type").as_str() {
            "producer" => None,
            name => Compression::from_name(name),
        };
        let (cleanup_delete, cleanup_compact) =
            parse_cleanup_policy(&get("cleanup.policy")).unwrap_or((true, false));
        TopicConfig {
            cleanup_delete,
            cleanup_compact,
            delete_retention_ms: long("delete.retention.ms"),
            min_cleanable_dirty_ratio: get("min.cleanable.dirty.ratio")
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|r| (0.0..=1.0).contains(r))
                .unwrap_or(0.5),
            min_compaction_lag_ms: long("min.compaction.lag.ms"),
            max_compaction_lag_ms: long("max.compaction.lag.ms"),
            compression,
            flush_messages: long("flush.messages"),
            flush_ms: long("flush.ms"),
            index_interval_bytes: long("index.interval.bytes").clamp(0, u32::MAX as i64) as u32,
            max_message_bytes: long("max.message.bytes").clamp(0, i32::MAX as i64) as i32,
            log_append_time: get("message.timestamp.type") == "LogAppendTime",
            min_insync_replicas: long("min.insync.replicas").clamp(1, i32::MAX as i64) as i32,
            unclean_leader_election: get("unclean.leader.election.enable")
                .trim()
                .eq_ignore_ascii_case("true"),
            retention_bytes: long("retention.bytes"),
            retention_ms: long("retention.ms"),
            segment_bytes: long("segment.bytes").max(SEGMENT_BYTES_MIN) as u64,
            segment_index_bytes: long("segment.index.bytes").clamp(4096, i32::MAX as i64) as u32,
            segment_ms: long("segment.ms"),
        }
    }
}

impl TopicConfig {
    /// The `retention.ms` the log applies: Kafka deletes by retention only
    /// when `cleanup.policy` has `delete` (`UnifiedLog.deleteOldSegments`),
    /// so a compact-only topic keeps its segments whatever retention.ms
    /// says (-1 = keep forever).
    pub fn effective_retention_ms(&self) -> i64 {
        if self.cleanup_delete {
            self.retention_ms
        } else {
            -1
        }
    }

    /// The `retention.bytes` the log applies (see
    /// [`TopicConfig::effective_retention_ms`]).
    pub fn effective_retention_bytes(&self) -> i64 {
        if self.cleanup_delete {
            self.retention_bytes
        } else {
            -1
        }
    }
}

/// One row of DescribeConfigs for a topic.
pub struct DescribedConfig {
    pub name: &'static str,
    pub value: String,
    pub is_default: bool,
    pub kind: ConfigType,
    pub doc: &'static str,
}

/// Every supported key with its effective value, as DescribeConfigs lists them.
pub fn describe(
    overrides: &BTreeMap<String, String>,
    broker: &BrokerConfig,
) -> Vec<DescribedConfig> {
    KEYS.iter()
        .map(|k| match overrides.get(k.name) {
            Some(v) => DescribedConfig {
                name: k.name,
                value: v.clone(),
                is_default: false,
                kind: k.kind,
                doc: k.doc,
            },
            None => DescribedConfig {
                name: k.name,
                value: (k.default)(broker),
                is_default: true,
                kind: k.kind,
                doc: k.doc,
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServeArgs;

    fn broker() -> BrokerConfig {
        ServeArgs::default().resolve().unwrap()
    }

    #[test]
    fn defaults_follow_the_broker() {
        let c = TopicConfig::resolve(&BTreeMap::new(), &broker());
        assert_eq!(c.compression, None);
        assert_eq!(c.retention_ms, 7 * 24 * 3600 * 1000);
        assert_eq!(c.segment_bytes, 1 << 30);
        assert_eq!(c.flush_messages, i64::MAX);
        assert!(!c.log_append_time);
    }

    #[test]
    fn overrides_apply_and_bad_values_are_refused() {
        let mut o = BTreeMap::new();
        o.insert("compression.type".to_string(), "lz4".to_string());
        o.insert("retention.ms".to_string(), "-1".to_string());
        assert!(validate_all(&o, &broker()).is_ok());
        let c = TopicConfig::resolve(&o, &broker());
        assert_eq!(c.compression, Some(Compression::Lz4));
        assert_eq!(c.retention_ms, -1);
        assert!(validate("compression.type", "brotli").is_err());
        assert!(validate("segment.bytes", "100").is_err());
        assert!(validate("cleanup.policy", "lz4").is_err());
        assert_eq!(
            validate("no.such.key", "1"),
            Err(ConfigError::UnknownKey("no.such.key".into()))
        );
    }

    #[test]
    fn cleanup_policy_takes_delete_compact_or_both() {
        for (value, delete, compact) in [
            ("delete", true, false),
            ("compact", false, true),
            ("compact,delete", true, true),
            ("delete, compact", true, true),
        ] {
            assert!(validate("cleanup.policy", value).is_ok(), "{value}");
            let o = BTreeMap::from([("cleanup.policy".to_string(), value.to_string())]);
            let c = TopicConfig::resolve(&o, &broker());
            assert_eq!((c.cleanup_delete, c.cleanup_compact), (delete, compact));
        }
        assert_eq!(parse_cleanup_policy(""), Ok((false, false)));
        for bad in ["compacted", "compact;delete", "compact,,delete"] {
            assert!(validate("cleanup.policy", bad).is_err(), "{bad:?}");
        }
        let o = BTreeMap::from([(
            "cleanup.policy".to_string(),
            " delete , compact".to_string(),
        )]);
        assert_eq!(normalized(o)["cleanup.policy"], "delete,compact");
        let c = TopicConfig::resolve(&BTreeMap::new(), &broker());
        assert!(c.cleanup_delete && !c.cleanup_compact);
        assert_eq!(c.effective_retention_ms(), 7 * 24 * 3600 * 1000);
    }

    #[test]
    fn only_a_policy_with_delete_deletes_by_retention() {
        let with = |policy: &str| {
            let o = BTreeMap::from([
                ("cleanup.policy".to_string(), policy.to_string()),
                ("retention.ms".to_string(), "1000".to_string()),
                ("retention.bytes".to_string(), "2000000".to_string()),
            ]);
            let c = TopicConfig::resolve(&o, &broker());
            (c.effective_retention_ms(), c.effective_retention_bytes())
        };
        assert_eq!(with("delete"), (1000, 2_000_000));
        assert_eq!(with("compact,delete"), (1000, 2_000_000));
        assert_eq!(with("compact"), (-1, -1));
        assert_eq!(with(""), (-1, -1));
    }

    #[test]
    fn compaction_configs_have_kafkas_defaults_and_bounds() {
        let c = TopicConfig::resolve(&BTreeMap::new(), &broker());
        assert_eq!(c.delete_retention_ms, 24 * 3600 * 1000);
        assert_eq!(c.min_compaction_lag_ms, 0);
        assert_eq!(c.max_compaction_lag_ms, i64::MAX);
        assert_eq!(c.min_cleanable_dirty_ratio, 0.5);
        let row = |name: &str| {
            describe(&BTreeMap::new(), &broker())
                .into_iter()
                .find(|r| r.name == name)
                .unwrap()
        };
        assert_eq!(row("min.cleanable.dirty.ratio").value, "0.5");
        assert_eq!(row("min.cleanable.dirty.ratio").kind, ConfigType::Double);
        assert_eq!(row("delete.retention.ms").value, "86400000");
        assert_eq!(row("max.compaction.lag.ms").value, i64::MAX.to_string());
        assert!(validate("min.cleanable.dirty.ratio", "0").is_ok());
        assert!(validate("min.cleanable.dirty.ratio", "1").is_ok());
        assert!(validate("min.cleanable.dirty.ratio", "1.01").is_err());
        assert!(validate("min.cleanable.dirty.ratio", "-0.1").is_err());
        assert!(validate("min.cleanable.dirty.ratio", "NaN").is_err());
        assert!(validate("delete.retention.ms", "0").is_ok());
        assert!(validate("delete.retention.ms", "-1").is_err());
        assert!(validate("min.compaction.lag.ms", "-1").is_err());
        assert!(validate("max.compaction.lag.ms", "0").is_err());
        assert!(validate("max.compaction.lag.ms", "1").is_ok());
        let o = BTreeMap::from([
            ("min.compaction.lag.ms".to_string(), "10".to_string()),
            ("max.compaction.lag.ms".to_string(), "5".to_string()),
        ]);
        assert!(matches!(
            validate_all(&o, &broker()),
            Err(ConfigError::Conflict(_))
        ));
        let o = BTreeMap::from([("min.compaction.lag.ms".to_string(), "10".to_string())]);
        assert!(validate_all(&o, &broker()).is_ok());
    }

    #[test]
    fn every_kafka_topic_config_is_accepted_with_kafkas_validation() {
        // Kafka 4.4's topic configs (kafka-configs --describe --all on a
        // stock broker).
        for key in [
            "cleanup.policy",
            "delete.retention.ms",
            "max.compaction.lag.ms",
            "min.cleanable.dirty.ratio",
            "min.compaction.lag.ms",
            "compression.gzip.level",
            "compression.lz4.level",
            "compression.type",
            "compression.zstd.level",
            "errors.deadletterqueue.group.enable",
            "file.delete.delay.ms",
            "flush.messages",
            "flush.ms",
            "follower.replication.throttled.replicas",
            "index.interval.bytes",
            "leader.replication.throttled.replicas",
            "local.retention.bytes",
            "local.retention.ms",
            "max.decompressed.message.bytes",
            "max.message.bytes",
            "message.timestamp.after.max.ms",
            "message.timestamp.before.max.ms",
            "message.timestamp.type",
            "min.insync.replicas",
            "preallocate",
            "remote.copy.lag.bytes",
            "remote.copy.lag.ms",
            "remote.log.copy.disable",
            "remote.log.delete.on.disable",
            "remote.storage.enable",
            "retention.bytes",
            "retention.ms",
            "segment.bytes",
            "segment.index.bytes",
            "segment.jitter.ms",
            "segment.ms",
            "unclean.leader.election.enable",
        ] {
            let k = KEYS.iter().find(|k| k.name == key).expect(key);
            assert_eq!(validate(key, &(k.default)(&broker())), Ok(()), "{key}");
        }
        // Stock Kafka 4.4's answers, message for message.
        let refused = |key: &str, value: &str| validate(key, value).unwrap_err().to_string();
        for (key, value, message) in [
            ("max.decompressed.message.bytes", "0", "Invalid value 0 for configuration max.decompressed.message.bytes: Value must be at least 1"),
            ("max.decompressed.message.bytes", "3000000000", "Invalid value 3000000000 for configuration max.decompressed.message.bytes: Not a number of type INT"),
            ("compression.gzip.level", "0", "Invalid value 0 for configuration compression.gzip.level: Value must be between 1 and 9 or equal to -1"),
            ("compression.lz4.level", "18", "Invalid value 18 for configuration compression.lz4.level: Value must be no more than 17"),
            ("compression.zstd.level", "-131073", "Invalid value -131073 for configuration compression.zstd.level: Value must be at least -131072"),
            ("unclean.leader.election.enable", "yes", "Invalid value yes for configuration unclean.leader.election.enable: Expected value to be either true or false"),
            ("local.retention.ms", "-3", "Invalid value -3 for configuration local.retention.ms: Value must be at least -2"),
            ("remote.copy.lag.ms", "-2", "Invalid value -2 for configuration remote.copy.lag.ms: Value must be at least -1"),
            ("follower.replication.throttled.replicas", "0:x", "Invalid value [0:x] for configuration follower.replication.throttled.replicas: follower.replication.throttled.replicas must be the literal '*' or a list of replicas in the following format: [partitionId]:[brokerId],[partitionId]:[brokerId],..."),
            ("remote.storage.enable", "true", "Tiered Storage functionality is disabled in the broker. Topic cannot be configured with remote log storage."),
            ("message.downconversion.enable", "true", "Unknown topic config name: message.downconversion.enable"),
        ] {
            assert_eq!(refused(key, value), message);
        }
        for (key, value) in [
            ("compression.gzip.level", "5"),
            ("compression.zstd.level", "-131072"),
            ("unclean.leader.election.enable", "TRUE"),
            ("local.retention.bytes", "-2"),
            ("follower.replication.throttled.replicas", "0:1,1:1"),
            ("leader.replication.throttled.replicas", "*"),
            ("remote.storage.enable", "false"),
        ] {
            assert_eq!(validate(key, value), Ok(()), "{key}={value}");
        }
    }

    #[test]
    fn describe_marks_defaults() {
        let mut o = BTreeMap::new();
        o.insert("retention.ms".to_string(), "1000".to_string());
        let rows = describe(&o, &broker());
        assert_eq!(rows.len(), KEYS.len());
        let r = rows.iter().find(|r| r.name == "retention.ms").unwrap();
        assert!(!r.is_default && r.value == "1000");
        assert!(
            rows.iter()
                .find(|r| r.name == "segment.ms")
                .unwrap()
                .is_default
        );
    }
}

//! Topic configs: the keys fjord understands, their defaults (from the broker
//! config, as Kafka derives `retention.ms` from `log.retention.ms`), their
//! validation, and the resolved [`TopicConfig`] a partition runs with.
//!
//! A key Kafka has but fjord does not implement is rejected with
//! INVALID_CONFIG rather than silently accepted: a user who sets it must not
//! believe it takes effect.

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

/// One supported key: name, type, and its default given the broker config.
pub struct ConfigKey {
    pub name: &'static str,
    pub kind: ConfigType,
    pub default: fn(&BrokerConfig) -> String,
    pub doc: &'static str,
}

const FOREVER: i64 = i64::MAX;

/// The topic configs fjord implements, in the order DescribeConfigs lists them.
pub const KEYS: &[ConfigKey] = &[
    ConfigKey {
        name: "cleanup.policy",
        kind: ConfigType::List,
        default: |_| "delete".into(),
        doc: "Only 'delete' is supported: whole segments are removed by retention.",
    },
    ConfigKey {
        name: "compression.type",
        kind: ConfigType::String,
        default: |_| "producer".into(),
        doc: "'producer' keeps the producer's codec; a codec name recompresses to it.",
    },
    ConfigKey {
        name: "flush.messages",
        kind: ConfigType::Long,
        default: |_| FOREVER.to_string(),
        doc: "fdatasync after this many messages.",
    },
    ConfigKey {
        name: "flush.ms",
        kind: ConfigType::Long,
        default: |_| FOREVER.to_string(),
        doc: "fdatasync at least this often.",
    },
    ConfigKey {
        name: "index.interval.bytes",
        kind: ConfigType::Int,
        default: |_| "4096".into(),
        doc: "Bytes appended between offset index entries.",
    },
    ConfigKey {
        name: "max.message.bytes",
        kind: ConfigType::Int,
        default: |b| b.message_max_bytes.to_string(),
        doc: "Largest record batch accepted.",
    },
    ConfigKey {
        name: "message.timestamp.type",
        kind: ConfigType::String,
        default: |_| "CreateTime".into(),
        doc: "CreateTime keeps the producer's timestamps; LogAppendTime sets the broker's.",
    },
    ConfigKey {
        name: "min.insync.replicas",
        kind: ConfigType::Int,
        default: |_| "1".into(),
        doc: "Effective value is min(this, replicas) = 1 on one node.",
    },
    ConfigKey {
        name: "retention.bytes",
        kind: ConfigType::Long,
        default: |_| "-1".into(),
        doc: "Delete old segments beyond this size per partition; -1 = no limit.",
    },
    ConfigKey {
        name: "retention.ms",
        kind: ConfigType::Long,
        default: |b| b.log_retention_ms.to_string(),
        doc: "Delete segments older than this; -1 = keep forever.",
    },
    ConfigKey {
        name: "segment.bytes",
        kind: ConfigType::Int,
        default: |b| b.log_segment_bytes.to_string(),
        doc: "Roll to a new segment at this size.",
    },
    ConfigKey {
        name: "segment.index.bytes",
        kind: ConfigType::Int,
        default: |_| (10 * 1024 * 1024).to_string(),
        doc: "Maximum size of an offset or time index file.",
    },
    ConfigKey {
        name: "segment.ms",
        kind: ConfigType::Long,
        default: |_| (7i64 * 24 * 60 * 60 * 1000).to_string(),
        doc: "Roll to a new segment after this long.",
    },
];

/// Kafka's lower bound for `segment.bytes` (1 MiB since Kafka 4.0).
pub const SEGMENT_BYTES_MIN: i64 = 1024 * 1024;

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
        .map_err(|_| invalid(key, value, "not a number"))?;
    if v < min {
        return Err(invalid(key, value, &format!("must be at least {min}")));
    }
    Ok(v)
}

fn parse_int(key: &str, value: &str, min: i64) -> Result<i64, ConfigError> {
    let v = parse_long(key, value, min)?;
    if v > i32::MAX as i64 {
        return Err(invalid(key, value, "must fit in an int"));
    }
    Ok(v)
}

/// Checks one key/value pair as Kafka's `LogConfig.validate` would.
pub fn validate(key: &str, value: &str) -> Result<(), ConfigError> {
    match key {
        "cleanup.policy" => {
            if value.trim() != "delete" {
                return Err(invalid(key, value, "fjord supports only 'delete'"));
            }
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
        "min.insync.replicas" => {
            parse_int(key, value, 1)?;
        }
        _ => return Err(ConfigError::UnknownKey(key.into())),
    }
    Ok(())
}

/// Validates a whole set of overrides.
pub fn validate_all(configs: &BTreeMap<String, String>) -> Result<(), ConfigError> {
    configs.iter().try_for_each(|(k, v)| validate(k, v))
}

/// The configs one partition runs with: overrides on top of broker defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct TopicConfig {
    /// None = `producer` (keep the producer's codec).
    pub compression: Option<Compression>,
    pub flush_messages: i64,
    pub flush_ms: i64,
    pub index_interval_bytes: u32,
    pub max_message_bytes: i32,
    pub log_append_time: bool,
    pub min_insync_replicas: i32,
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
        TopicConfig {
            compression,
            flush_messages: long("flush.messages"),
            flush_ms: long("flush.ms"),
            index_interval_bytes: long("index.interval.bytes").clamp(0, u32::MAX as i64) as u32,
            max_message_bytes: long("max.message.bytes").clamp(0, i32::MAX as i64) as i32,
            log_append_time: get("message.timestamp.type") == "LogAppendTime",
            min_insync_replicas: long("min.insync.replicas").clamp(1, i32::MAX as i64) as i32,
            retention_bytes: long("retention.bytes"),
            retention_ms: long("retention.ms"),
            segment_bytes: long("segment.bytes").max(SEGMENT_BYTES_MIN) as u64,
            segment_index_bytes: long("segment.index.bytes").clamp(4096, i32::MAX as i64) as u32,
            segment_ms: long("segment.ms"),
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
        assert!(validate_all(&o).is_ok());
        let c = TopicConfig::resolve(&o, &broker());
        assert_eq!(c.compression, Some(Compression::Lz4));
        assert_eq!(c.retention_ms, -1);
        assert!(validate("compression.type", "brotli").is_err());
        assert!(validate("segment.bytes", "100").is_err());
        assert!(validate("cleanup.policy", "compact").is_err());
        assert_eq!(
            validate("no.such.key", "1"),
            Err(ConfigError::UnknownKey("no.such.key".into()))
        );
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

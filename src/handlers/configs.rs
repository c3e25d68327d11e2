//! DescribeConfigs, AlterConfigs, IncrementalAlterConfigs.
//!
//! Topic configs are stored as overrides in the metadata log by the
//! controller. Broker configs are static in fjord (flags / TOML file): they can
//! be described, but altering one answers INVALID_REQUEST rather than
//! pretending to apply it.

use super::forward::forward_items;
use super::{decode, errors, respond, str_bytes, ErrorAnswer, Outcome};
use crate::auth::acl::AclOperation;
use crate::config::BrokerConfig;
use crate::handlers::authz::Authz;
use crate::metadata::{internal, topic_config};
use crate::protocol::RequestHeader;
use crate::shard::messages::{ConfigChange, ControllerRequest};
use crate::shard::ShardCtx;
use bytes::BytesMut;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::{
    alter_configs_response, incremental_alter_configs_response, AlterConfigsRequest,
    AlterConfigsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
};
use kafka_protocol::ResponseError;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

/// Kafka's ConfigResource.Type codes.
pub const RESOURCE_TOPIC: i8 = 2;
pub const RESOURCE_BROKER: i8 = 4;
/// Kafka's DescribeConfigs config source codes.
const SOURCE_TOPIC_CONFIG: i8 = 1;
const SOURCE_STATIC_BROKER_CONFIG: i8 = 4;
const SOURCE_DEFAULT_CONFIG: i8 = 5;
/// IncrementalAlterConfigs operations.
const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;

/// The broker settings DescribeConfigs reports, with Kafka's names:
/// (name, value, type, Kafka's default). A value equal to Kafka's default
/// is reported as DEFAULT_CONFIG, any other as STATIC_BROKER_CONFIG (set by
/// a flag or the config file).
fn broker_configs(
    c: &BrokerConfig,
) -> Vec<(&'static str, String, topic_config::ConfigType, String)> {
    use topic_config::ConfigType as T;
    let mut out = vec![
        (
            "auto.create.topics.enable",
            c.auto_create_topics_enable.to_string(),
            T::Boolean,
            "true".to_string(),
        ),
        ("broker.id", c.node_id.to_string(), T::Int, String::new()),
        // One replica per partition whatever a client asks for
        // (docs/replication-factor.md), hence 1 wherever Kafka has a
        // replication factor or an in-sync minimum.
        ("default.replication.factor", "1".into(), T::Int, "1".into()),
        (
            "group.initial.rebalance.delay.ms",
            c.group_initial_rebalance_delay_ms.to_string(),
            T::Int,
            "3000".into(),
        ),
        (
            "group.max.size",
            c.group_max_size.to_string(),
            T::Int,
            "2147483647".into(),
        ),
        (
            "max.connections",
            c.max_connections_per_shard.to_string(),
            T::Int,
            "2147483647".into(),
        ),
        (
            "connections.max.idle.ms",
            c.connections_max_idle_ms.to_string(),
            T::Long,
            "600000".into(),
        ),
        (
            "offsets.retention.minutes",
            c.offsets_retention_minutes.to_string(),
            T::Int,
            "10080".into(),
        ),
        (
            "offsets.topic.num.partitions",
            internal::INTERNAL_TOPIC_PARTITIONS.to_string(),
            T::Int,
            "50".into(),
        ),
        (
            "offsets.topic.replication.factor",
            "1".into(),
            T::Short,
            "3".into(),
        ),
        (
            "transaction.state.log.min.isr",
            "1".into(),
            T::Int,
            "2".into(),
        ),
        (
            "transaction.state.log.num.partitions",
            internal::INTERNAL_TOPIC_PARTITIONS.to_string(),
            T::Int,
            "50".into(),
        ),
        (
            "transaction.state.log.replication.factor",
            "1".into(),
            T::Short,
            "3".into(),
        ),
        (
            "transactional.id.expiration.ms",
            c.transactional_id_expiration_ms.to_string(),
            T::Int,
            "604800000".into(),
        ),
        (
            "log.dirs",
            c.data_dir.display().to_string(),
            T::String,
            String::new(),
        ),
        (
            "num.partitions",
            c.num_partitions.to_string(),
            T::Int,
            "1".into(),
        ),
        (
            "socket.request.max.bytes",
            crate::protocol::SOCKET_REQUEST_MAX_BYTES.to_string(),
            T::Int,
            crate::protocol::SOCKET_REQUEST_MAX_BYTES.to_string(),
        ),
    ];
    // The broker-level synonym of every topic config, valued as the topic
    // default it gives.
    for (topic_key, broker_key, kafka_default) in TOPIC_CONFIG_SYNONYMS {
        if let Some(k) = topic_config::KEYS.iter().find(|k| k.name == *topic_key) {
            out.push((
                broker_key,
                (k.default)(c),
                k.kind,
                kafka_default.to_string(),
            ));
        }
    }
    out.sort_by(|a, b| a.0.cmp(b.0));
    out
}

/// Topic configs and the broker config that gives their default (Kafka's
/// `ServerTopicConfigSynonyms`), with that broker config's default in Kafka.
const TOPIC_CONFIG_SYNONYMS: &[(&str, &str, &str)] = &[
    ("cleanup.policy", "log.cleanup.policy", "delete"),
    ("compression.gzip.level", "compression.gzip.level", "-1"),
    ("compression.lz4.level", "compression.lz4.level", "9"),
    ("compression.type", "compression.type", "producer"),
    ("compression.zstd.level", "compression.zstd.level", "3"),
    (
        "delete.retention.ms",
        "log.cleaner.delete.retention.ms",
        "86400000",
    ),
    (
        "file.delete.delay.ms",
        "log.segment.delete.delay.ms",
        "60000",
    ),
    (
        "flush.messages",
        "log.flush.interval.messages",
        "9223372036854775807",
    ),
    ("flush.ms", "log.flush.interval.ms", "9223372036854775807"),
    ("index.interval.bytes", "log.index.interval.bytes", "4096"),
    ("local.retention.bytes", "log.local.retention.bytes", "-2"),
    ("local.retention.ms", "log.local.retention.ms", "-2"),
    (
        "max.compaction.lag.ms",
        "log.cleaner.max.compaction.lag.ms",
        "9223372036854775807",
    ),
    (
        "max.decompressed.message.bytes",
        "max.decompressed.message.bytes",
        "2147483639",
    ),
    ("max.message.bytes", "message.max.bytes", "1048588"),
    (
        "message.timestamp.after.max.ms",
        "log.message.timestamp.after.max.ms",
        "3600000",
    ),
    (
        "message.timestamp.before.max.ms",
        "log.message.timestamp.before.max.ms",
        "9223372036854775807",
    ),
    (
        "message.timestamp.type",
        "log.message.timestamp.type",
        "CreateTime",
    ),
    (
        "min.cleanable.dirty.ratio",
        "log.cleaner.min.cleanable.ratio",
        "0.5",
    ),
    (
        "min.compaction.lag.ms",
        "log.cleaner.min.compaction.lag.ms",
        "0",
    ),
    ("min.insync.replicas", "min.insync.replicas", "1"),
    ("preallocate", "log.preallocate", "false"),
    ("remote.copy.lag.bytes", "log.remote.copy.lag.bytes", "-1"),
    ("remote.copy.lag.ms", "log.remote.copy.lag.ms", "0"),
    ("retention.bytes", "log.retention.bytes", "-1"),
    ("retention.ms", "log.retention.ms", "604800000"),
    ("segment.bytes", "log.segment.bytes", "1073741824"),
    (
        "segment.index.bytes",
        "log.index.size.max.bytes",
        "10485760",
    ),
    ("segment.ms", "log.roll.ms", "604800000"),
    (
        "unclean.leader.election.enable",
        "unclean.leader.election.enable",
        "false",
    ),
];

/// DEFAULT_CONFIG when `value` is Kafka's default, else STATIC_BROKER_CONFIG.
fn broker_source(value: &str, kafka_default: &str) -> i8 {
    if value == kafka_default {
        SOURCE_DEFAULT_CONFIG
    } else {
        SOURCE_STATIC_BROKER_CONFIG
    }
}

fn synonym(name: &str, value: &str, source: i8) -> DescribeConfigsSynonym {
    DescribeConfigsSynonym::default()
        .with_name(str_bytes(name.to_string()))
        .with_value(Some(str_bytes(value.to_string())))
        .with_source(source)
}

/// One topic config's row: its value and source, and (KIP-226) its
/// synonyms most specific first: the topic's override, then the broker
/// config its default comes from.
fn topic_entry(
    c: topic_config::DescribedConfig,
    broker: &BrokerConfig,
    include_synonyms: bool,
    include_documentation: bool,
) -> DescribeConfigsResourceResult {
    let broker_synonym = TOPIC_CONFIG_SYNONYMS
        .iter()
        .find(|(t, _, _)| *t == c.name)
        .and_then(|(t, b, kafka_default)| {
            let key = topic_config::KEYS.iter().find(|k| k.name == *t)?;
            let value = (key.default)(broker);
            let source = broker_source(&value, kafka_default);
            Some((*b, value, source))
        });
    let source = if !c.is_default {
        SOURCE_TOPIC_CONFIG
    } else {
        broker_synonym
            .as_ref()
            .map_or(SOURCE_DEFAULT_CONFIG, |(_, _, s)| *s)
    };
    let mut e = DescribeConfigsResourceResult::default()
        .with_name(str_bytes(c.name))
        .with_value(Some(str_bytes(c.value.clone())))
        .with_config_source(source)
        .with_config_type(c.kind as i8);
    if include_synonyms {
        let mut synonyms = Vec::new();
        if !c.is_default {
            synonyms.push(synonym(c.name, &c.value, SOURCE_TOPIC_CONFIG));
        }
        if let Some((name, value, source)) = &broker_synonym {
            synonyms.push(synonym(name, value, *source));
        }
        e = e.with_synonyms(synonyms);
    }
    if include_documentation {
        e = e.with_documentation(Some(str_bytes(c.doc)));
    }
    e
}

pub fn describe(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<DescribeConfigsRequest>(header, body) else {
        return Outcome::Close;
    };
    let image = ctx.image();
    let results = req
        .resources
        .iter()
        .map(|r| {
            let name = r.resource_name.to_string();
            let wanted = |key: &str| {
                r.configuration_keys
                    .as_ref()
                    .is_none_or(|keys| keys.iter().any(|k| k.as_str() == key))
            };
            let base = DescribeConfigsResult::default()
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone());
            if let Some(e) = refusal(authz, AclOperation::DescribeConfigs, r.resource_type, &name) {
                return base
                    .with_error_code(e.code())
                    .with_error_message(Some(str_bytes(e.to_string())));
            }
            match r.resource_type {
                RESOURCE_TOPIC => match image.topic(&name) {
                    None => base
                        .with_error_code(ResponseError::UnknownTopicOrPartition.code())
                        .with_error_message(Some(str_bytes(format!(
                            "Topic {name} does not exist"
                        )))),
                    Some(t) => {
                        let configs = topic_config::describe(&t.configs, &ctx.config)
                            .into_iter()
                            .filter(|c| wanted(c.name))
                            .map(|c| {
                                topic_entry(
                                    c,
                                    &ctx.config,
                                    req.include_synonyms,
                                    req.include_documentation,
                                )
                            })
                            .collect();
                        base.with_configs(configs)
                    }
                },
                RESOURCE_BROKER => {
                    let configs = broker_configs(&ctx.config)
                        .into_iter()
                        .filter(|(k, _, _, _)| wanted(k))
                        .map(|(k, v, kind, kafka_default)| {
                            let source = broker_source(&v, &kafka_default);
                            let mut e = DescribeConfigsResourceResult::default()
                                .with_name(str_bytes(k))
                                .with_value(Some(str_bytes(v.clone())))
                                .with_read_only(true)
                                .with_config_source(source)
                                .with_config_type(kind as i8);
                            if req.include_synonyms {
                                e = e.with_synonyms(vec![synonym(k, &v, source)]);
                            }
                            e
                        })
                        .collect();
                    base.with_configs(configs)
                }
                _ => base
                    .with_error_code(ResponseError::InvalidRequest.code())
                    .with_error_message(Some(str_bytes("Unsupported resource type"))),
            }
        })
        .collect();
    respond(
        header,
        &DescribeConfigsResponse::default().with_results(results),
    )
}

/// The answer to a config change of an internal topic. The group and
/// transaction coordinators' state lives in those logs and fjord does not
/// compact them yet, so `retention.ms=1` would delete every committed offset
/// and transaction; Kafka, whose internal topics are compacted, accepts such
/// changes.
fn internal_topic_refusal(name: &str) -> ErrorAnswer {
    (
        ResponseError::InvalidRequest.code(),
        format!("The configs of internal topic {name} cannot be changed: its coordinator's state lives there"),
    )
}

/// Kafka's `ConfigHelper` / `handleAlterConfigsRequest` checks: `op`
/// (DESCRIBE_CONFIGS or ALTER_CONFIGS) on the topic, else
/// TOPIC_AUTHORIZATION_FAILED; on the cluster for a broker resource, else
/// CLUSTER_AUTHORIZATION_FAILED; on the group, else
/// GROUP_AUTHORIZATION_FAILED.
fn refusal(authz: &Authz, op: AclOperation, kind: i8, name: &str) -> Option<ResponseError> {
    let allowed = match kind {
        RESOURCE_TOPIC => authz.topic(op, name),
        RESOURCE_BROKER | RESOURCE_BROKER_LOGGER => authz.cluster(op),
        RESOURCE_GROUP => authz.group(op, name),
        _ => return None,
    };
    match (allowed, kind) {
        (true, _) => None,
        (false, RESOURCE_TOPIC) => Some(ResponseError::TopicAuthorizationFailed),
        (false, RESOURCE_GROUP) => Some(ResponseError::GroupAuthorizationFailed),
        (false, _) => Some(ResponseError::ClusterAuthorizationFailed),
    }
}

/// Kafka's BROKER_LOGGER and GROUP config resource types.
const RESOURCE_BROKER_LOGGER: i8 = 8;
const RESOURCE_GROUP: i8 = 32;

/// Runs topic config changes through the controller; returns per-resource
/// (error code, message) in request order. A resource the principal may
/// not ALTER_CONFIGS is refused first (no message, as in Kafka).
async fn apply(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    resources: Vec<(i8, String, Result<ConfigChange, ErrorAnswer>)>,
    validate_only: bool,
) -> Vec<(i8, String, i16, Option<String>)> {
    let resources: Vec<_> = resources
        .into_iter()
        .map(|(kind, name, change)| {
            let change = if let Some(e) = refusal(authz, AclOperation::AlterConfigs, kind, &name) {
                Err((e.code(), String::new()))
            } else if kind == RESOURCE_TOPIC && internal::is_internal(&name) {
                Err(internal_topic_refusal(&name))
            } else {
                change
            };
            (kind, name, change)
        })
        .collect();
    let changes: Vec<(String, ConfigChange)> = resources
        .iter()
        .filter(|(t, _, c)| *t == RESOURCE_TOPIC && c.is_ok())
        .filter_map(|(_, n, c)| c.as_ref().ok().map(|c| (n.clone(), c.clone())))
        .collect();
    let outcomes: HashMap<String, Result<i32, crate::shard::messages::ControllerError>> =
        if changes.is_empty() {
            HashMap::new()
        } else {
            let names: Vec<String> = changes.iter().map(|(n, _)| n.clone()).collect();
            let request = ControllerRequest::AlterConfigs {
                changes,
                validate_only,
            };
            forward_items(ctx, request, &names).await
        };
    resources
        .into_iter()
        .map(|(kind, name, change)| match (kind, change) {
            (_, Err((code, msg))) => (kind, name, code, (!msg.is_empty()).then_some(msg)),
            (RESOURCE_TOPIC, Ok(_)) => match outcomes.get(&name) {
                Some(Ok(_)) => (kind, name, errors::NONE, None),
                Some(Err(e)) => (
                    kind,
                    name.clone(),
                    errors::controller(e),
                    Some(e.to_string()),
                ),
                None => (kind, name, ResponseError::UnknownServerError.code(), None),
            },
            // Nothing is set dynamically, so deleting dynamic broker
            // configs changes nothing and succeeds, as Kafka's delete of an
            // unset config does (`kafka-reassign-partitions --verify`
            // clears its throttles this way).
            (RESOURCE_BROKER, Ok(ConfigChange::Incremental(ops)))
                if ops.iter().all(|(_, v)| v.is_none()) =>
            {
                (kind, name, errors::NONE, None)
            }
            (RESOURCE_BROKER, Ok(_)) => (
                kind,
                name,
                ResponseError::InvalidRequest.code(),
                Some(
                    "fjord's broker configs are static; set them with flags or the config file"
                        .into(),
                ),
            ),
            (_, Ok(_)) => (
                kind,
                name,
                ResponseError::InvalidRequest.code(),
                Some("Unsupported resource type".into()),
            ),
        })
        .collect()
}

pub async fn alter(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<AlterConfigsRequest>(header, body) else {
        return Outcome::Close;
    };
    let resources = req
        .resources
        .iter()
        .map(|r| {
            let mut all = BTreeMap::new();
            let mut bad = None;
            for c in &r.configs {
                match &c.value {
                    Some(v) => {
                        all.insert(c.name.to_string(), v.to_string());
                    }
                    None => bad = Some(c.name.to_string()),
                }
            }
            let change = match bad {
                Some(k) => Err((
                    ResponseError::InvalidConfig.code(),
                    format!("Null value not supported for : {k}"),
                )),
                None => Ok(ConfigChange::ReplaceAll(all)),
            };
            (r.resource_type, r.resource_name.to_string(), change)
        })
        .collect();
    let responses = apply(ctx, authz, resources, req.validate_only)
        .await
        .into_iter()
        .map(|(kind, name, code, msg)| {
            alter_configs_response::AlterConfigsResourceResponse::default()
                .with_resource_type(kind)
                .with_resource_name(str_bytes(name))
                .with_error_code(code)
                .with_error_message(msg.map(str_bytes))
        })
        .collect();
    respond(
        header,
        &AlterConfigsResponse::default().with_responses(responses),
    )
}

pub async fn incremental_alter(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<IncrementalAlterConfigsRequest>(header, body) else {
        return Outcome::Close;
    };
    let resources = req
        .resources
        .iter()
        .map(|r| {
            let mut ops = Vec::new();
            let mut bad = None;
            for c in &r.configs {
                match (c.config_operation, &c.value) {
                    (OP_SET, Some(v)) => ops.push((c.name.to_string(), Some(v.to_string()))),
                    (OP_DELETE, _) => ops.push((c.name.to_string(), None)),
                    (OP_SET, None) => {
                        bad = Some((
                            ResponseError::InvalidRequest.code(),
                            format!("Null value not supported for : {}", c.name.as_str()),
                        ))
                    }
                    (op, _) => {
                        bad = Some((
                            ResponseError::InvalidConfig.code(),
                            format!(
                                "Config operation {op} (APPEND or SUBTRACT) is not supported by fjord for {}: SET the whole list instead",
                                c.name.as_str()
                            ),
                        ))
                    }
                }
            }
            let change = match bad {
                Some(e) => Err(e),
                None => Ok(ConfigChange::Incremental(ops)),
            };
            (r.resource_type, r.resource_name.to_string(), change)
        })
        .collect();
    let responses = apply(ctx, authz, resources, req.validate_only)
        .await
        .into_iter()
        .map(|(kind, name, code, msg)| {
            incremental_alter_configs_response::AlterConfigsResourceResponse::default()
                .with_resource_type(kind)
                .with_resource_name(str_bytes(name))
                .with_error_code(code)
                .with_error_message(msg.map(str_bytes))
        })
        .collect();
    respond(
        header,
        &IncrementalAlterConfigsResponse::default().with_responses(responses),
    )
}

//! CreateTopics, DeleteTopics and CreatePartitions: validated and applied by
//! the controller (shard 0), answered once every shard serves the change.

use super::forward::forward_items;
use super::{decode, errors, respond, str_bytes, ErrorAnswer, Outcome};
use crate::auth::acl::AclOperation;
use crate::handlers::authz::Authz;
use crate::metadata::{internal, topic_config};
use crate::protocol::RequestHeader;
use crate::shard::messages::{ControllerRequest, NewTopic};
use crate::shard::ShardCtx;
use bytes::BytesMut;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{
    CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse,
    DeleteTopicsRequest, DeleteTopicsResponse, TopicName,
};
use kafka_protocol::ResponseError;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;
use uuid::Uuid;

/// Kafka's config source code for a value set on the topic.
const SOURCE_TOPIC_CONFIG: i8 = 1;
/// Kafka's config source code for a default value.
const SOURCE_DEFAULT_CONFIG: i8 = 5;

/// Names that appear more than once in one request.
fn duplicates<'a>(names: impl Iterator<Item = &'a str>) -> HashSet<String> {
    let mut seen = HashSet::new();
    let mut dup = HashSet::new();
    for n in names {
        if !seen.insert(n) {
            dup.insert(n.to_string());
        }
    }
    dup
}

pub async fn create_topics(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<CreateTopicsRequest>(header, body) else {
        return Outcome::Close;
    };
    let dup = duplicates(req.topics.iter().map(|t| t.name.0.as_str()));
    let cluster_create = authz.cluster_quiet(AclOperation::Create);
    let mut results: Vec<(String, Result<(), ErrorAnswer>)> = Vec::new();
    let mut todo = Vec::new();
    for t in &req.topics {
        let name = t.name.0.to_string();
        if dup.contains(&name) {
            results.push((
                name,
                Err((
                    ResponseError::InvalidRequest.code(),
                    "Found multiple entries for this topic.".into(),
                )),
            ));
            continue;
        }
        if internal::is_internal(&name) {
            results.push((
                name,
                Err((
                    ResponseError::InvalidRequest.code(),
                    "Creation of an internal topic is not allowed; the broker creates it on first use.".into(),
                )),
            ));
            continue;
        }
        // Kafka: CREATE on the cluster, or on the topic.
        if !cluster_create && !authz.topic(AclOperation::Create, &name) {
            results.push((
                name,
                Err((
                    ResponseError::TopicAuthorizationFailed.code(),
                    "Topic authorization failed.".into(),
                )),
            ));
            continue;
        }
        let mut configs = BTreeMap::new();
        let mut null_config = None;
        for c in &t.configs {
            match &c.value {
                Some(v) => {
                    configs.insert(c.name.to_string(), v.to_string());
                }
                None => null_config = Some(c.name.to_string()),
            }
        }
        if let Some(key) = null_config {
            results.push((
                name,
                Err((
                    ResponseError::InvalidConfig.code(),
                    format!("Null value not supported for topic configs: {key}"),
                )),
            ));
            continue;
        }
        results.push((name.clone(), Ok(())));
        todo.push(NewTopic {
            name,
            num_partitions: t.num_partitions,
            replication_factor: t.replication_factor,
            assignments: t
                .assignments
                .iter()
                .map(|a| {
                    (
                        a.partition_index,
                        a.broker_ids.iter().map(|b| b.0).collect(),
                    )
                })
                .collect(),
            configs,
        });
    }
    let names: Vec<String> = todo.iter().map(|t| t.name.clone()).collect();
    let outcomes = if todo.is_empty() {
        HashMap::new()
    } else {
        forward_items(
            ctx,
            ControllerRequest::CreateTopics {
                topics: todo,
                validate_only: req.validate_only,
            },
            &names,
        )
        .await
    };
    let image = ctx.image();
    let topics = results
        .into_iter()
        .map(|(name, pre)| {
            let mut r =
                CreatableTopicResult::default().with_name(TopicName(str_bytes(name.clone())));
            let outcome = match pre {
                Err((code, msg)) => Err((code, msg)),
                Ok(()) => match outcomes.get(&name) {
                    Some(Ok(count)) => Ok(*count),
                    Some(Err(e)) => Err((errors::controller(e), e.to_string())),
                    None => Err((ResponseError::UnknownServerError.code(), "no result".into())),
                },
            };
            match outcome {
                // The configs are shown only with DESCRIBE_CONFIGS on the
                // topic (Kafka's `topicConfigErrorCode`).
                Ok(count) if !authz.topic(AclOperation::DescribeConfigs, &name) => {
                    if let Some(t) = image.topic(&name) {
                        r = r.with_topic_id(Uuid::from_bytes(t.id));
                    }
                    r.with_num_partitions(count)
                        .with_replication_factor(1)
                        .with_topic_config_error_code(
                            ResponseError::TopicAuthorizationFailed.code(),
                        )
                }
                Ok(count) => {
                    let overrides = image
                        .topic(&name)
                        .map(|t| t.configs.clone())
                        .unwrap_or_default();
                    if let Some(t) = image.topic(&name) {
                        r = r.with_topic_id(Uuid::from_bytes(t.id));
                    }
                    let configs = topic_config::describe(&overrides, &ctx.config)
                        .into_iter()
                        .map(|c| {
                            CreatableTopicConfigs::default()
                                .with_name(str_bytes(c.name))
                                .with_value(Some(str_bytes(c.value)))
                                .with_config_source(if c.is_default {
                                    SOURCE_DEFAULT_CONFIG
                                } else {
                                    SOURCE_TOPIC_CONFIG
                                })
                        })
                        .collect();
                    r.with_num_partitions(count)
                        .with_replication_factor(1)
                        .with_configs(Some(configs))
                }
                Err((code, msg)) => r
                    .with_error_code(code)
                    .with_error_message(Some(str_bytes(msg)))
                    .with_num_partitions(-1)
                    .with_replication_factor(-1),
            }
        })
        .collect();
    respond(header, &CreateTopicsResponse::default().with_topics(topics))
}

pub async fn delete_topics(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<DeleteTopicsRequest>(header, body) else {
        return Outcome::Close;
    };
    let image = ctx.image();
    // (name if resolvable, topic id as asked, error before the controller)
    let mut asked: Vec<(Option<String>, Uuid, Option<ResponseError>)> = Vec::new();
    if header.api_version >= 6 {
        for t in &req.topics {
            match &t.name {
                Some(n) => asked.push((Some(n.0.to_string()), t.topic_id, None)),
                None => match image.topic_by_id(t.topic_id.as_bytes()) {
                    Some(meta) => asked.push((Some(meta.name.clone()), t.topic_id, None)),
                    None => asked.push((None, t.topic_id, Some(ResponseError::UnknownTopicId))),
                },
            }
        }
    } else {
        for n in &req.topic_names {
            asked.push((Some(n.0.to_string()), Uuid::nil(), None));
        }
    }
    // Kafka's controller: DELETE on the cluster allows every topic; else
    // DELETE on each (TOPIC_AUTHORIZATION_FAILED). A topic asked by id is
    // answered without its name unless the principal may DESCRIBE it.
    let cluster_delete = authz.cluster_quiet(AclOperation::Delete);
    for (name, id, pre) in &mut asked {
        let Some(n) = name.as_deref() else { continue };
        if pre.is_some() || cluster_delete || authz.topic(AclOperation::Delete, n) {
            continue;
        }
        *pre = Some(ResponseError::TopicAuthorizationFailed);
        if !id.is_nil() && !authz.topic(AclOperation::Describe, n) {
            *name = None;
        }
    }
    let dup = duplicates(asked.iter().filter_map(|(n, _, _)| n.as_deref()));
    let names: Vec<String> = asked
        .iter()
        .filter(|(n, _, e)| {
            e.is_none()
                && n.as_ref()
                    .is_some_and(|n| !dup.contains(n) && !internal::is_internal(n))
        })
        .filter_map(|(n, _, _)| n.clone())
        .collect();
    let outcomes = if names.is_empty() {
        HashMap::new()
    } else {
        forward_items(
            ctx,
            ControllerRequest::DeleteTopics {
                names: names.clone(),
            },
            &names,
        )
        .await
    };
    let responses = asked
        .into_iter()
        .map(|(name, id, pre)| {
            let id = match (&name, id.is_nil()) {
                (Some(n), true) => image.topic(n).map(|t| Uuid::from_bytes(t.id)).unwrap_or(id),
                _ => id,
            };
            let r = DeletableTopicResult::default()
                .with_name(name.clone().map(|n| TopicName(str_bytes(n))))
                .with_topic_id(id);
            let err: Option<ErrorAnswer> = match (pre, &name) {
                (Some(ResponseError::TopicAuthorizationFailed), _) => Some((
                    ResponseError::TopicAuthorizationFailed.code(),
                    "Topic authorization failed.".into(),
                )),
                (Some(e), _) => Some((e.code(), "Topic id not found".into())),
                (None, Some(n)) if dup.contains(n) => Some((
                    ResponseError::InvalidRequest.code(),
                    "Duplicate topic in request.".into(),
                )),
                (None, Some(n)) if internal::is_internal(n) => Some((
                    ResponseError::TopicAuthorizationFailed.code(),
                    "Internal topics cannot be deleted.".into(),
                )),
                (None, Some(n)) => match outcomes.get(n) {
                    Some(Ok(_)) => None,
                    Some(Err(e)) => Some((errors::controller(e), e.to_string())),
                    None => Some((ResponseError::UnknownServerError.code(), "no result".into())),
                },
                (None, None) => Some((
                    ResponseError::UnknownTopicId.code(),
                    "Topic id not found".into(),
                )),
            };
            match err {
                None => r,
                Some((code, msg)) => r
                    .with_error_code(code)
                    .with_error_message(Some(str_bytes(msg))),
            }
        })
        .collect();
    respond(
        header,
        &DeleteTopicsResponse::default().with_responses(responses),
    )
}

pub async fn create_partitions(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<CreatePartitionsRequest>(header, body) else {
        return Outcome::Close;
    };
    let dup = duplicates(req.topics.iter().map(|t| t.name.0.as_str()));
    let mut pre: HashMap<String, ErrorAnswer> = HashMap::new();
    let mut todo = Vec::new();
    let mut assignments: Vec<(String, Vec<Vec<i32>>)> = Vec::new();
    for t in &req.topics {
        let name = t.name.0.to_string();
        if dup.contains(&name) {
            pre.insert(
                name,
                (
                    ResponseError::InvalidRequest.code(),
                    "Duplicate topic in request.".into(),
                ),
            );
        } else if !authz.topic(AclOperation::Alter, &name) {
            pre.insert(
                name,
                (
                    ResponseError::TopicAuthorizationFailed.code(),
                    "The topic authorization is failed.".into(),
                ),
            );
        } else if internal::is_internal(&name) {
            // The coordinator of a group or transactional id is the owner of
            // `hash(id) % partitions` of its internal topic: more partitions
            // would move every id to another coordinator, away from its state.
            pre.insert(
                name,
                (
                    ResponseError::InvalidRequest.code(),
                    "The partitions of an internal topic cannot be changed.".into(),
                ),
            );
        } else {
            if let Some(a) = &t.assignments {
                let lists = a
                    .iter()
                    .map(|p| p.broker_ids.iter().map(|b| b.0).collect())
                    .collect();
                assignments.push((name.clone(), lists));
            }
            todo.push((name, t.count));
        }
    }
    let names: Vec<String> = todo.iter().map(|(n, _)| n.clone()).collect();
    let outcomes = if todo.is_empty() {
        HashMap::new()
    } else {
        forward_items(
            ctx,
            ControllerRequest::CreatePartitions {
                topics: todo,
                validate_only: req.validate_only,
                assignments,
            },
            &names,
        )
        .await
    };
    let results = req
        .topics
        .iter()
        .map(|t| {
            let name = t.name.0.to_string();
            let r = CreatePartitionsTopicResult::default().with_name(t.name.clone());
            let err = match pre.get(&name) {
                Some(e) => Some(e.clone()),
                None => match outcomes.get(&name) {
                    Some(Ok(_)) => None,
                    Some(Err(e)) => Some((errors::controller(e), e.to_string())),
                    None => Some((ResponseError::UnknownServerError.code(), "no result".into())),
                },
            };
            match err {
                None => r,
                Some((code, msg)) => r
                    .with_error_code(code)
                    .with_error_message(Some(str_bytes(msg))),
            }
        })
        .collect();
    respond(
        header,
        &CreatePartitionsResponse::default().with_results(results),
    )
}

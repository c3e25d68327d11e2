//! DescribeCluster, DescribeLogDirs and UnregisterBroker.
//!
//! Each shard is a broker: DescribeCluster lists all of them (several
//! nodes: those of every live registered node, as Metadata does; v2 with
//! `IncludeFencedBrokers` also those of fenced registered nodes, marked
//! fenced, KIP-1073); DescribeLogDirs,
//! sent by a client to each broker in turn, reports the partitions of the
//! shard that answers.
//!
//! As in Kafka, DescribeCluster checks nothing, except that the cluster's
//! authorized operations, when asked for, are 0 to a principal that may not
//! DESCRIBE the cluster; DescribeLogDirs needs DESCRIBE on the cluster.
//!
//! UnregisterBroker (`kafka-cluster unregister --id`, KIP-500;
//! `docs/replication.md` §3.2) needs ALTER on the cluster, else
//! CLUSTER_AUTHORIZATION_FAILED; the controller (the quorum's leader,
//! forwarded to as every metadata write) unregisters the node of the
//! broker id, or answers BROKER_ID_NOT_REGISTERED with Kafka's message.

use super::errors::CLUSTER_AUTHORIZATION_FAILED_MESSAGE;
use super::forward::forward;
use super::{decode, respond, str_bytes, Outcome};
use crate::auth::acl::{AclOperation, ResourceType, CLUSTER_NAME};
use crate::handlers::authz::Authz;
use crate::protocol::hand_versions::{
    DescribeLogDirsRequestV5, DescribeLogDirsResponseV5, DESCRIBE_LOG_DIRS_CORDONED_VERSION,
};
use crate::protocol::RequestHeader;
use crate::shard::messages::{ControllerReply, ControllerRequest};
use crate::shard::ShardCtx;
use bytes::BytesMut;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::{
    BrokerId, DescribeClusterRequest, DescribeClusterResponse, DescribeLogDirsRequest,
    DescribeLogDirsResponse, TopicName, UnregisterBrokerRequest, UnregisterBrokerResponse,
};
use kafka_protocol::ResponseError;
use std::collections::BTreeMap;
use std::rc::Rc;

/// DescribeCluster's endpoint type for broker listeners.
const ENDPOINT_TYPE_BROKERS: i8 = 1;

/// `listener`: the connection's listener, whose endpoints are answered.
pub fn describe_cluster(
    ctx: &Rc<ShardCtx>,
    listener: usize,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<DescribeClusterRequest>(header, body) else {
        return Outcome::Close;
    };
    let cluster_authorized_operations = if !req.include_cluster_authorized_operations {
        i32::MIN // the schema's default
    } else if authz.cluster(AclOperation::Describe) {
        authz.authorized_operations(ResourceType::Cluster, CLUSTER_NAME)
    } else {
        0
    };
    let image = ctx.image();
    let broker = |(id, host, port): (i32, String, i32), fenced: bool| {
        DescribeClusterBroker::default()
            .with_broker_id(BrokerId(id))
            .with_host(str_bytes(host))
            .with_port(port)
            .with_is_fenced(fenced)
    };
    let mut brokers: Vec<DescribeClusterBroker> = super::metadata::brokers(ctx, &image, listener)
        .into_iter()
        .map(|b| broker(b, false))
        .collect();
    if header.api_version >= 2 && req.include_fenced_brokers {
        let fenced = super::metadata::other_brokers(ctx, &image, listener, true);
        brokers.extend(fenced.into_iter().map(|b| broker(b, true)));
        brokers.sort_by_key(|b| b.broker_id.0);
    }
    let mut resp = DescribeClusterResponse::default()
        .with_cluster_authorized_operations(cluster_authorized_operations)
        .with_cluster_id(str_bytes(image.cluster_id_or(&ctx.config.cluster_id)))
        .with_controller_id(BrokerId(ctx.config.node_id_of(0)))
        .with_brokers(brokers);
    if header.api_version >= 1 {
        resp = resp.with_endpoint_type(ENDPOINT_TYPE_BROKERS);
    }
    respond(header, &resp)
}

/// UnregisterBroker (see the module doc): the answer comes once the
/// quorum committed the change and this node applied it.
pub async fn unregister_broker(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<UnregisterBrokerRequest>(header, body) else {
        return Outcome::Close;
    };
    let answer = |code: i16, message: Option<String>| {
        respond(
            header,
            &UnregisterBrokerResponse::default()
                .with_error_code(code)
                .with_error_message(message.map(str_bytes)),
        )
    };
    if !authz.cluster(AclOperation::Alter) {
        return answer(
            ResponseError::ClusterAuthorizationFailed.code(),
            Some(CLUSTER_AUTHORIZATION_FAILED_MESSAGE.to_string()),
        );
    }
    let request = ControllerRequest::UnregisterBroker {
        broker: req.broker_id.0,
    };
    let reply = forward(ctx, request, |reply| match reply {
        ControllerReply::Broker(result) => Some(result),
        _ => None,
    });
    match reply.await {
        Ok(Ok(())) => answer(super::errors::NONE, None),
        Ok(Err(e)) => answer(super::errors::controller(&e), Some(e.to_string())),
        Err(e) => {
            let (code, message) = e.code_and_message();
            answer(code, message)
        }
    }
}

/// Total and available bytes of the file system holding `path`.
fn disk_space(path: &std::path::Path) -> (i64, i64) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return (-1, -1);
    };
    // SAFETY: statvfs is plain old data; c is a valid NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return (-1, -1);
    }
    let frsize = st.f_frsize as i64;
    (st.f_blocks as i64 * frsize, st.f_bavail as i64 * frsize)
}

pub fn describe_log_dirs(
    ctx: &Rc<ShardCtx>,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let v = header.api_version;
    let req = if v >= DESCRIBE_LOG_DIRS_CORDONED_VERSION {
        decode::<DescribeLogDirsRequestV5>(header, body).map(|r| r.0)
    } else {
        decode::<DescribeLogDirsRequest>(header, body)
    };
    let Some(req) = req else {
        return Outcome::Close;
    };
    // Kafka: DESCRIBE on the cluster, else no results and
    // CLUSTER_AUTHORIZATION_FAILED (the top-level code, v3+).
    if !authz.cluster(AclOperation::Describe) {
        let resp = DescribeLogDirsResponse::default()
            .with_error_code(ResponseError::ClusterAuthorizationFailed.code());
        return if v >= DESCRIBE_LOG_DIRS_CORDONED_VERSION {
            respond(
                header,
                &DescribeLogDirsResponseV5 {
                    response: resp,
                    cordoned: Vec::new(),
                },
            )
        } else {
            respond(header, &resp)
        };
    }
    let wanted = |topic: &str, partition: i32| match &req.topics {
        None => true,
        Some(ts) => ts
            .iter()
            .any(|t| t.topic.0.as_str() == topic && t.partitions.contains(&partition)),
    };
    let mut by_topic: BTreeMap<String, Vec<DescribeLogDirsPartition>> = BTreeMap::new();
    for p in ctx.partitions() {
        if wanted(&p.tp.topic, p.tp.partition.0) {
            by_topic.entry(p.tp.topic.clone()).or_default().push(
                DescribeLogDirsPartition::default()
                    .with_partition_index(p.tp.partition.0)
                    .with_partition_size(p.log.size_bytes() as i64),
            );
        }
    }
    let topics = by_topic
        .into_iter()
        .map(|(name, mut partitions)| {
            partitions.sort_by_key(|p| p.partition_index);
            DescribeLogDirsTopic::default()
                .with_name(TopicName(str_bytes(name)))
                .with_partitions(partitions)
        })
        .collect();
    let dir = std::fs::canonicalize(&ctx.config.data_dir).unwrap_or(ctx.config.data_dir.clone());
    let mut result = DescribeLogDirsResult::default()
        .with_log_dir(str_bytes(dir.display().to_string()))
        .with_topics(topics);
    if v >= 4 {
        let (total, usable) = disk_space(&dir);
        result = result.with_total_bytes(total).with_usable_bytes(usable);
    }
    let resp = DescribeLogDirsResponse::default().with_results(vec![result]);
    if v >= DESCRIBE_LOG_DIRS_CORDONED_VERSION {
        // v5 (KIP-1066): fjord has one log directory and no way to cordon
        // it, so it always takes new partitions.
        respond(
            header,
            &DescribeLogDirsResponseV5 {
                response: resp,
                cordoned: vec![false],
            },
        )
    } else {
        respond(header, &resp)
    }
}

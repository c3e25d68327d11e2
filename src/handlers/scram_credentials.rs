//! DescribeUserScramCredentials (50) and AlterUserScramCredentials (51):
//! SCRAM users managed as Kafka manages them (`kafka-configs --entity-type
//! users --alter --add-config 'SCRAM-SHA-256=[iterations=8192,password=...]'`).
//!
//! The Java admin client salts the password itself and sends the salt,
//! the iteration count and the salted password; the broker keeps only the
//! StoredKey and ServerKey made from it (`auth::scram`), in the metadata
//! log (`MetadataRecord::UserScramCredential`), applied to every shard's
//! image by the controller like any other metadata change. Validation and
//! messages are Kafka's `ScramControlManager`'s (alter) and `ScramImage`'s
//! (describe).
//!
//! Authorization: Kafka requires DESCRIBE (50) and ALTER (51) on the
//! Cluster resource. The ACL authorizer adds that check at the top of
//! [`describe`] and [`alter`], where `session` is passed for it; until
//! then any client that authenticated may call them.

use super::forward::forward;
use super::{decode, errors, respond, str_bytes, Outcome};
use crate::auth::acl::AclOperation;
use crate::auth::scram::{ScramMechanism, ITERATIONS_MAX, ITERATIONS_MIN};
use crate::auth::Session;
use crate::handlers::authz::Authz;
use crate::protocol::RequestHeader;
use crate::shard::messages::{ControllerReply, ControllerRequest, ScramChange};
use crate::shard::ShardCtx;
use bytes::BytesMut;
use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse,
    DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
};
use kafka_protocol::ResponseError;
use std::collections::BTreeMap;
use std::rc::Rc;

pub fn describe(
    ctx: &ShardCtx,
    _session: &Session,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<DescribeUserScramCredentialsRequest>(header, body) else {
        return Outcome::Close;
    };
    // Kafka's handleDescribeUserScramCredentialsRequest: DESCRIBE on the
    // cluster, else a top-level CLUSTER_AUTHORIZATION_FAILED.
    if !authz.cluster(AclOperation::Describe) {
        return respond(
            header,
            &DescribeUserScramCredentialsResponse::default()
                .with_error_code(ResponseError::ClusterAuthorizationFailed.code())
                .with_error_message(Some(str_bytes(
                    errors::CLUSTER_AUTHORIZATION_FAILED_MESSAGE,
                ))),
        );
    }
    let image = ctx.image();
    // Kafka's ScramImage.describe: no users named means every user; a user
    // named twice is DUPLICATE_RESOURCE.
    let mut users: BTreeMap<String, bool> = BTreeMap::new();
    match req.users.as_deref() {
        None | Some([]) => {
            for user in image.scram_credentials.keys() {
                users.insert(user.clone(), false);
            }
        }
        Some(named) => {
            for u in named {
                let seen = users.contains_key(u.name.as_str());
                users.insert(u.name.to_string(), seen);
            }
        }
    }
    let results = users
        .into_iter()
        .map(|(user, duplicate)| {
            let result = DescribeUserScramCredentialsResult::default().with_user(str_bytes(&user));
            if duplicate {
                return result
                    .with_error_code(ResponseError::DuplicateResource.code())
                    .with_error_message(Some(str_bytes(format!(
                        "Cannot describe SCRAM credentials for the same user twice in a single request: {user}"
                    ))));
            }
            match image.scram_credentials.get(&user) {
                Some(by_mechanism) if !by_mechanism.is_empty() => result.with_credential_infos(
                    by_mechanism
                        .iter()
                        .map(|(m, c)| {
                            CredentialInfo::default()
                                .with_mechanism(*m)
                                .with_iterations(c.iterations)
                        })
                        .collect(),
                ),
                _ => result
                    .with_error_code(ResponseError::ResourceNotFound.code())
                    .with_error_message(Some(str_bytes(format!(
                        "Attempt to describe a user credential that does not exist: {user}"
                    )))),
            }
        })
        .collect();
    respond(
        header,
        &DescribeUserScramCredentialsResponse::default().with_results(results),
    )
}

/// Kafka's `ScramControlManager.validateScramUsernameAndMechanism`.
fn validate(name: &str, mechanism: i8) -> Result<ScramMechanism, (i16, String)> {
    if name.is_empty() {
        return Err((
            ResponseError::UnacceptableCredential.code(),
            "Username must not be empty".into(),
        ));
    }
    ScramMechanism::from_type_id(mechanism).ok_or((
        ResponseError::UnsupportedSaslMechanism.code(),
        "Unknown SCRAM mechanism".into(),
    ))
}

pub async fn alter(
    ctx: &Rc<ShardCtx>,
    _session: &Session,
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(req) = decode::<AlterUserScramCredentialsRequest>(header, body) else {
        return Outcome::Close;
    };
    // Kafka's controller: ALTER on the cluster, else every user named gets
    // CLUSTER_AUTHORIZATION_FAILED (AlterUserScramCredentialsRequest's
    // error response).
    if !authz.cluster(AclOperation::Alter) {
        let users: std::collections::BTreeSet<String> = req
            .deletions
            .iter()
            .map(|d| d.name.to_string())
            .chain(req.upsertions.iter().map(|u| u.name.to_string()))
            .collect();
        let results = users
            .into_iter()
            .map(|user| {
                AlterUserScramCredentialsResult::default()
                    .with_user(str_bytes(user))
                    .with_error_code(ResponseError::ClusterAuthorizationFailed.code())
                    .with_error_message(Some(str_bytes(
                        errors::CLUSTER_AUTHORIZATION_FAILED_MESSAGE,
                    )))
            })
            .collect();
        return respond(
            header,
            &AlterUserScramCredentialsResponse::default().with_results(results),
        );
    }
    let mut errors_by_user: BTreeMap<String, (i16, String)> = BTreeMap::new();
    let mut changes: BTreeMap<String, ScramChange> = BTreeMap::new();
    let duplicate = || {
        (
            ResponseError::DuplicateResource.code(),
            "A user credential cannot be altered twice in the same request".to_string(),
        )
    };
    for d in &req.deletions {
        let name = d.name.to_string();
        if errors_by_user.contains_key(&name) {
            continue;
        }
        if changes.remove(&name).is_some() {
            errors_by_user.insert(name, duplicate());
            continue;
        }
        match validate(&name, d.mechanism) {
            Ok(_) => {
                changes.insert(
                    name,
                    ScramChange::Delete {
                        mechanism: d.mechanism,
                    },
                );
            }
            Err(e) => {
                errors_by_user.insert(name, e);
            }
        }
    }
    for u in &req.upsertions {
        let name = u.name.to_string();
        if errors_by_user.contains_key(&name) {
            continue;
        }
        if changes.remove(&name).is_some() {
            errors_by_user.insert(name, duplicate());
            continue;
        }
        let checked = validate(&name, u.mechanism).and_then(|m| {
            if u.iterations < ITERATIONS_MIN {
                Err((
                    ResponseError::UnacceptableCredential.code(),
                    "Too few iterations".to_string(),
                ))
            } else if u.iterations > ITERATIONS_MAX {
                Err((
                    ResponseError::UnacceptableCredential.code(),
                    "Too many iterations".to_string(),
                ))
            } else {
                Ok(m)
            }
        });
        match checked {
            Ok(m) => {
                let credential =
                    m.credential_from_salted(&u.salted_password, u.salt.to_vec(), u.iterations);
                changes.insert(
                    name,
                    ScramChange::Upsert {
                        mechanism: u.mechanism,
                        credential,
                    },
                );
            }
            Err(e) => {
                errors_by_user.insert(name, e);
            }
        }
    }
    let mut results = Vec::new();
    if !changes.is_empty() {
        let names: Vec<String> = changes.keys().cloned().collect();
        let request = ControllerRequest::AlterScramCredentials {
            changes: changes.into_iter().collect(),
        };
        let outcome = forward(ctx, request, |reply| match reply {
            ControllerReply::Items(items) => Some(items),
            _ => None,
        });
        let items = match outcome.await {
            Ok(items) => items,
            Err(e) => names
                .into_iter()
                .map(|n| (n, Err(e.item_error())))
                .collect(),
        };
        for (name, result) in items {
            let r = AlterUserScramCredentialsResult::default().with_user(str_bytes(name));
            results.push(match result {
                Ok(_) => r.with_error_code(errors::NONE),
                Err(e) => r
                    .with_error_code(errors::controller(&e))
                    .with_error_message(Some(str_bytes(e.to_string()))),
            });
        }
    }
    for (name, (code, message)) in errors_by_user {
        results.push(
            AlterUserScramCredentialsResult::default()
                .with_user(str_bytes(name))
                .with_error_code(code)
                .with_error_message(Some(str_bytes(message))),
        );
    }
    respond(
        header,
        &AlterUserScramCredentialsResponse::default().with_results(results),
    )
}

/// DescribeClientQuotas (48): fjord has no client quotas, so every filter
/// matches nothing and the answer is Kafka's for a cluster without quotas
/// (no entries). `kafka-configs --describe --entity-type users` asks for
/// them beside the SCRAM credentials and fails on a broker that does not
/// serve the API. AlterClientQuotas is not served: a quota could not be
/// enforced.
pub fn describe_client_quotas(
    authz: &Authz,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> Outcome {
    let Some(_req) = decode::<kafka_protocol::messages::DescribeClientQuotasRequest>(header, body)
    else {
        return Outcome::Close;
    };
    // Kafka's handleDescribeClientQuotasRequest: DESCRIBE_CONFIGS on the
    // cluster, else CLUSTER_AUTHORIZATION_FAILED and no entries.
    if !authz.cluster(AclOperation::DescribeConfigs) {
        return respond(
            header,
            &kafka_protocol::messages::DescribeClientQuotasResponse::default()
                .with_error_code(ResponseError::ClusterAuthorizationFailed.code())
                .with_error_message(Some(str_bytes(
                    errors::CLUSTER_AUTHORIZATION_FAILED_MESSAGE,
                )))
                .with_entries(None),
        );
    }
    respond(
        header,
        &kafka_protocol::messages::DescribeClientQuotasResponse::default()
            .with_entries(Some(Vec::new())),
    )
}

//! The one way a handler asks the controller for something and unpacks
//! the reply: [`forward`]. The controller is shard 0 of this node, which
//! on several nodes forwards the request to the metadata quorum's leader
//! (`shard::controller`); every reply is a [`ControllerReply`] of the kind
//! the request asks for, and a handler wants exactly that kind.
//!
//! Why one function: each controller-forwarded handler used to repeat the
//! same match (the wanted variant, else an error for a reply of another
//! kind, else the controller's error with its message), and the answers
//! for the two failures must stay the same everywhere: a request-level
//! answer is the controller's error code and message, or
//! UNKNOWN_SERVER_ERROR without a message for a reply of another kind (a
//! bug, never expected); a per-item answer counts a reply of another kind
//! as the controller being unavailable.

use super::errors;
use crate::shard::messages::{ControllerError, ControllerReply, ControllerRequest};
use crate::shard::ShardCtx;
use kafka_protocol::ResponseError;
use std::collections::HashMap;
use std::rc::Rc;

/// Why a forwarded request brought no reply of the wanted kind.
#[derive(Clone, Debug)]
pub enum ForwardError {
    /// The controller refused the request or did not answer in time.
    Controller(ControllerError),
    /// The controller answered with a reply of another kind.
    WrongReply,
}

impl ForwardError {
    /// The answer for the whole request: the controller's error code and
    /// message, or UNKNOWN_SERVER_ERROR without a message.
    pub fn code_and_message(&self) -> (i16, Option<String>) {
        match self {
            ForwardError::Controller(e) => (errors::controller(e), Some(e.to_string())),
            ForwardError::WrongReply => (ResponseError::UnknownServerError.code(), None),
        }
    }

    /// The error of each item of the request: the controller's, or
    /// `Unavailable` for a reply of another kind.
    pub fn item_error(&self) -> ControllerError {
        match self {
            ForwardError::Controller(e) => e.clone(),
            ForwardError::WrongReply => ControllerError::Unavailable,
        }
    }
}

/// Runs `request` at the controller and takes from its reply what
/// `wanted` extracts (None: a reply of another kind).
pub async fn forward<T>(
    ctx: &Rc<ShardCtx>,
    request: ControllerRequest,
    wanted: impl FnOnce(ControllerReply) -> Option<T>,
) -> Result<T, ForwardError> {
    match ctx.invoke_controller(request).await {
        Ok(reply) => wanted(reply).ok_or(ForwardError::WrongReply),
        Err(e) => Err(ForwardError::Controller(e)),
    }
}

/// Runs `request`, whose reply is one result per name (CreateTopics,
/// DeleteTopics, CreatePartitions, AlterConfigs): each name's result; a
/// request that failed as a whole fails every one of `names`.
pub async fn forward_items(
    ctx: &Rc<ShardCtx>,
    request: ControllerRequest,
    names: &[String],
) -> HashMap<String, Result<i32, ControllerError>> {
    let items = forward(ctx, request, |reply| match reply {
        ControllerReply::Items(items) => Some(items),
        _ => None,
    });
    match items.await {
        Ok(items) => items.into_iter().collect(),
        Err(e) => names
            .iter()
            .map(|n| (n.clone(), Err(e.item_error())))
            .collect(),
    }
}

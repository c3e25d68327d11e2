//! Authorization of one request: what the handlers ask before they act,
//! and the audit log of every denial.
//!
//! [`Authz`] is built once per request from the connection's session
//! (principal, client address) and the shard's current ACL snapshot (the
//! `Arc` the metadata image carries, `auth::acl`). With `--authorizer none`
//! (the default, Kafka's empty `authorizer.class.name`) it holds nothing
//! and every question answers "allowed" without a lookup, so the hot paths
//! pay one branch.
//!
//! Which API checks what, with which error code, is the table in
//! `docs/security.md`, taken from Kafka's `KafkaApis`, `AclApis` and
//! `ConfigHelper`; the handlers follow it.
//!
//! Audit: a denial the client asked for explicitly (Kafka's
//! `logIfDenied = true`) is logged at info level on the `fjord::audit`
//! target with the principal, client address, operation, resource and
//! API. A client that sends denied requests in a loop must not flood the
//! log, so each shard logs at most [`AUDIT_DENIALS_PER_SECOND_MAX`] denials
//! a second and counts the rest, reporting how many it skipped with the
//! next one it logs. Filtering denials (Metadata hiding topics, ListGroups
//! skipping groups) are not logged, as in Kafka.

use crate::auth::acl::{
    self, AclOperation, AclSnapshot, AuthorizerSettings, ResourceType, CLUSTER_NAME,
};
use crate::auth::Session;
use crate::shard::ShardCtx;
use kafka_protocol::messages::ApiKey;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

/// Kafka's GROUP_AUTHORIZATION_FAILED (30), TOPIC_AUTHORIZATION_FAILED (29)
/// and TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53), as plain codes.
pub const GROUP_AUTHORIZATION_FAILED: i16 = 30;
pub const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
pub const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;

/// Denials one shard writes to the audit log per second; the rest are
/// counted and reported with the next line.
pub const AUDIT_DENIALS_PER_SECOND_MAX: u32 = 20;

/// The authorization context of one request.
pub struct Authz {
    /// None: no authorizer configured; everything is allowed.
    check: Option<Check>,
}

struct Check {
    settings: Rc<AuthorizerSettings>,
    acls: Arc<AclSnapshot>,
    session: Rc<Session>,
    api_key: i16,
}

impl Authz {
    /// The context of a request of `api_key` on the connection of `session`.
    pub fn new(ctx: &ShardCtx, session: &Rc<Session>, api_key: i16) -> Authz {
        let check = ctx.authorizer.as_ref().map(|settings| Check {
            settings: settings.clone(),
            acls: ctx.image().acls.clone(),
            session: session.clone(),
            api_key,
        });
        Authz { check }
    }

    /// A context that allows everything (for internal callers).
    pub fn allow_all() -> Authz {
        Authz { check: None }
    }

    /// Whether an authorizer is configured at all (the ACL APIs answer
    /// SECURITY_DISABLED when not).
    pub fn enabled(&self) -> bool {
        self.check.is_some()
    }

    /// May the principal do `op` on the resource? A denial is audited.
    pub fn allowed(&self, op: AclOperation, resource_type: ResourceType, name: &str) -> bool {
        self.decide(op, resource_type, name, true)
    }

    /// As [`Self::allowed`], but a denial is not logged: the answer only
    /// filters what the client sees (Kafka's `logIfDenied = false`).
    pub fn filter(&self, op: AclOperation, resource_type: ResourceType, name: &str) -> bool {
        self.decide(op, resource_type, name, false)
    }

    /// `op` on the cluster resource, audited.
    pub fn cluster(&self, op: AclOperation) -> bool {
        self.allowed(op, ResourceType::Cluster, CLUSTER_NAME)
    }

    /// `op` on the cluster resource, not audited.
    pub fn cluster_quiet(&self, op: AclOperation) -> bool {
        self.filter(op, ResourceType::Cluster, CLUSTER_NAME)
    }

    /// `op` on the topic, audited.
    pub fn topic(&self, op: AclOperation, name: &str) -> bool {
        self.allowed(op, ResourceType::Topic, name)
    }

    /// `op` on the group, audited.
    pub fn group(&self, op: AclOperation, name: &str) -> bool {
        self.allowed(op, ResourceType::Group, name)
    }

    /// `op` on the transactional id, audited.
    pub fn transactional_id(&self, op: AclOperation, name: &str) -> bool {
        self.allowed(op, ResourceType::TransactionalId, name)
    }

    /// Kafka's `authorizeByResourceType`: may the principal do `op` on some
    /// resource of `resource_type` (KIP-679)? A denial is audited.
    pub fn any_of_type(&self, op: AclOperation, resource_type: ResourceType) -> bool {
        let Some(c) = &self.check else {
            return true;
        };
        let who = c.session.principal();
        let host = c.session.peer.map(|a| a.ip());
        let ok = c
            .acls
            .authorize_any(&c.settings, &who, host, op, resource_type);
        if !ok {
            audit(c, op, resource_type, "*any*");
        }
        ok
    }

    /// Kafka's `authorizedOperations`: the bit field of the supported
    /// operations of the resource the principal may do (every supported
    /// one without an authorizer). Nothing is audited: the answer only
    /// informs the client.
    pub fn authorized_operations(&self, resource_type: ResourceType, name: &str) -> i32 {
        let ops = acl::supported_operations(resource_type).iter().copied();
        if self.check.is_none() {
            return acl::operations_bit_field(ops);
        }
        acl::operations_bit_field(ops.filter(|op| self.filter(*op, resource_type, name)))
    }

    fn decide(&self, op: AclOperation, resource_type: ResourceType, name: &str, log: bool) -> bool {
        let Some(c) = &self.check else {
            return true;
        };
        let who = c.session.principal();
        let host = c.session.peer.map(|a| a.ip());
        let ok = c
            .acls
            .authorize(&c.settings, &who, host, op, resource_type, name)
            .allowed();
        if !ok && log {
            audit(c, op, resource_type, name);
        }
        ok
    }
}

/// The audit log's budget on one shard: at most
/// [`AUDIT_DENIALS_PER_SECOND_MAX`] lines per one-second window; the
/// denials over it are counted and reported with the next line logged.
#[derive(Debug, Default)]
struct AuditBudget {
    window_start: Option<Instant>,
    logged_in_window: u32,
    skipped: u64,
}

impl AuditBudget {
    /// Whether a denial at `now` is logged; if so, how many were skipped
    /// since the last line.
    fn admit(&mut self, now: Instant) -> Option<u64> {
        let fresh = self
            .window_start
            .is_none_or(|s| now.saturating_duration_since(s).as_secs() >= 1);
        if fresh {
            self.window_start = Some(now);
            self.logged_in_window = 0;
        }
        if self.logged_in_window >= AUDIT_DENIALS_PER_SECOND_MAX {
            self.skipped += 1;
            return None;
        }
        self.logged_in_window += 1;
        Some(std::mem::take(&mut self.skipped))
    }
}

thread_local! {
    /// This shard's audit budget (a shard is one thread).
    static AUDIT: RefCell<AuditBudget> = RefCell::new(AuditBudget::default());
}

fn audit(c: &Check, op: AclOperation, resource_type: ResourceType, name: &str) {
    let now = crate::clock::monotonic();
    let Some(skipped_before) = AUDIT.with(|b| b.borrow_mut().admit(now)) else {
        return;
    };
    let api = ApiKey::try_from(c.api_key)
        .map(|k| format!("{k:?}"))
        .unwrap_or_else(|_| c.api_key.to_string());
    let client = c
        .session
        .peer
        .map(|a| a.to_string())
        .unwrap_or_else(|| "unknown".into());
    tracing::info!(
        target: "fjord::audit",
        principal = %c.session.principal(),
        client = %client,
        operation = %op,
        resource_type = %resource_type,
        resource = name,
        api = %api,
        skipped_before,
        "authorization denied"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_audit_log_takes_a_bounded_number_of_lines_a_second() {
        let mut b = AuditBudget::default();
        let t0 = Instant::now();
        for i in 0..AUDIT_DENIALS_PER_SECOND_MAX {
            assert_eq!(b.admit(t0), Some(0), "denial {i} is logged");
        }
        // A flood in the same second is counted, not logged.
        for _ in 0..1000 {
            assert_eq!(b.admit(t0 + Duration::from_millis(500)), None);
        }
        // The next second's first line reports them.
        assert_eq!(b.admit(t0 + Duration::from_secs(1)), Some(1000));
        assert_eq!(b.admit(t0 + Duration::from_secs(1)), Some(0));
    }
}

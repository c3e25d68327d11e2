//! Kafka's ACL model and the `StandardAuthorizer` decision, as pure data.
//!
//! An ACL binding is a resource pattern (resource type, name, LITERAL or
//! PREFIXED; the LITERAL name `*` matches every name) plus an access
//! control entry (principal `User:name` or `User:*`, host `*` or one client
//! IP, operation, ALLOW or DENY). The numeric codes of every enum are
//! Kafka's wire codes (`org.apache.kafka.common.acl.AclOperation` and
//! friends), so requests and the metadata log carry the same values.
//!
//! [`AclSnapshot`] is an immutable, indexed copy of every binding. The
//! metadata image holds it behind an `Arc` and replaces it whole when an
//! ACL record is applied (never on other metadata changes), so every shard
//! reads the copy its image carries without locks. [`AclSnapshot::authorize`]
//! is the hot-path call (Produce and Fetch make one per topic): it looks up
//! the resource's name in a per-resource-type hash map of LITERAL bindings,
//! the `*` wildcard entry, and one hash lookup per distinct PREFIXED
//! pattern length (a prefix of length n can only be `name[..n]`), so its
//! cost is independent of how many ACLs exist on other resources. Kafka's
//! `StandardAuthorizerData` walks a sorted tree to the same effect.
//!
//! The decision is `StandardAuthorizerData.findAclRule`'s:
//! - a super user is allowed everything;
//! - a matching DENY wins over any ALLOW; a DENY matches only its own
//!   operation (or ALL): DENY READ does not deny DESCRIBE;
//! - an ALLOW matches its operation, ALL, and the implied ones: DESCRIBE is
//!   implied by READ, WRITE, DELETE and ALTER; DESCRIBE_CONFIGS by
//!   ALTER_CONFIGS;
//! - with no ACL at all on the resource (any principal, any operation) the
//!   answer is `allow.everyone.if.no.acl.found` (default false); with ACLs
//!   present but none matching, it is denied.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use super::Principal;

/// Kafka's wildcard resource name (LITERAL `*` matches every name) and
/// wildcard host.
pub const WILDCARD: &str = "*";
/// Kafka's wildcard principal: matches every principal of type User.
pub const WILDCARD_PRINCIPAL: &str = "User:*";
/// The only name a CLUSTER resource has (`Resource.CLUSTER_NAME`).
pub const CLUSTER_NAME: &str = "kafka-cluster";
/// Bindings one broker keeps. A CreateAcls that would pass it is refused,
/// so no client can grow the image without bound.
pub const ACLS_MAX: usize = 100_000;

macro_rules! wire_enum {
    ($(#[$m:meta])* $name:ident { $($variant:ident = $code:expr, $text:expr;)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[repr(i8)]
        pub enum $name { $($variant = $code,)* }

        impl $name {
            /// The value of a wire code, or None for a code Kafka does not define.
            pub fn from_code(code: i8) -> Option<Self> {
                match code { $($code => Some(Self::$variant),)* _ => None }
            }

            pub fn code(self) -> i8 {
                self as i8
            }

            /// Kafka's upper-case name (`AclOperation.toString`).
            pub fn name(self) -> &'static str {
                match self { $(Self::$variant => $text,)* }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

wire_enum!(
    /// Kafka's `ResourceType`.
    ResourceType {
        Unknown = 0, "UNKNOWN";
        Any = 1, "ANY";
        Topic = 2, "TOPIC";
        Group = 3, "GROUP";
        Cluster = 4, "CLUSTER";
        TransactionalId = 5, "TRANSACTIONAL_ID";
        DelegationToken = 6, "DELEGATION_TOKEN";
        User = 7, "USER";
    }
);

wire_enum!(
    /// Kafka's `PatternType`.
    PatternType {
        Unknown = 0, "UNKNOWN";
        Any = 1, "ANY";
        Match = 2, "MATCH";
        Literal = 3, "LITERAL";
        Prefixed = 4, "PREFIXED";
    }
);

wire_enum!(
    /// Kafka's `AclOperation`.
    AclOperation {
        Unknown = 0, "UNKNOWN";
        Any = 1, "ANY";
        All = 2, "ALL";
        Read = 3, "READ";
        Write = 4, "WRITE";
        Create = 5, "CREATE";
        Delete = 6, "DELETE";
        Alter = 7, "ALTER";
        Describe = 8, "DESCRIBE";
        ClusterAction = 9, "CLUSTER_ACTION";
        DescribeConfigs = 10, "DESCRIBE_CONFIGS";
        AlterConfigs = 11, "ALTER_CONFIGS";
        IdempotentWrite = 12, "IDEMPOTENT_WRITE";
        CreateTokens = 13, "CREATE_TOKENS";
        DescribeTokens = 14, "DESCRIBE_TOKENS";
    }
);

wire_enum!(
    /// Kafka's `AclPermissionType`.
    AclPermission {
        Unknown = 0, "UNKNOWN";
        Any = 1, "ANY";
        Deny = 2, "DENY";
        Allow = 3, "ALLOW";
    }
);

/// The operations Kafka reports for a resource type in the
/// authorized-operations fields (Metadata, DescribeCluster, DescribeGroups,
/// ConsumerGroupDescribe, DescribeTopicPartitions): its `AclEntry`'s
/// supported operations, as Kafka 4.4 answers with no authorizer (topic
/// 3576, group 3400, cluster 8096, compared with the stock peer).
pub fn supported_operations(resource_type: ResourceType) -> &'static [AclOperation] {
    use AclOperation::*;
    match resource_type {
        ResourceType::Topic => &[
            Read,
            Write,
            Create,
            Describe,
            Delete,
            Alter,
            DescribeConfigs,
            AlterConfigs,
        ],
        ResourceType::Group => &[Read, Describe, Delete, DescribeConfigs, AlterConfigs],
        ResourceType::Cluster => &[
            Create,
            ClusterAction,
            DescribeConfigs,
            AlterConfigs,
            IdempotentWrite,
            Alter,
            Describe,
        ],
        ResourceType::TransactionalId => &[Describe, Write],
        ResourceType::DelegationToken => &[Describe],
        ResourceType::User => &[CreateTokens, DescribeTokens],
        ResourceType::Unknown | ResourceType::Any => &[],
    }
}

/// Kafka's 32-bit field of operations (bit `code` set for each).
pub fn operations_bit_field(ops: impl IntoIterator<Item = AclOperation>) -> i32 {
    ops.into_iter()
        .fold(0i32, |bits, op| bits | (1i32 << op.code()))
}

/// Resource types an ACL can name (a concrete type, not UNKNOWN or ANY).
const CONCRETE_TYPES: usize = 6;

fn type_slot(t: ResourceType) -> Option<usize> {
    match t {
        ResourceType::Topic => Some(0),
        ResourceType::Group => Some(1),
        ResourceType::Cluster => Some(2),
        ResourceType::TransactionalId => Some(3),
        ResourceType::DelegationToken => Some(4),
        ResourceType::User => Some(5),
        ResourceType::Unknown | ResourceType::Any => None,
    }
}

/// One ACL: a resource pattern and an access control entry (Kafka's
/// `AclBinding`), as stored in the metadata log.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AclBinding {
    pub resource_type: ResourceType,
    pub resource_name: String,
    pub pattern_type: PatternType,
    /// `type:name`, e.g. `User:alice` or `User:*`.
    pub principal: String,
    /// `*` or a client IP address.
    pub host: String,
    pub operation: AclOperation,
    pub permission: AclPermission,
}

impl AclBinding {
    /// Why Kafka would refuse to create this binding (INVALID_REQUEST), if
    /// it would (`AclControlManager.validateNewAcl` and `AclApis`).
    pub fn validate(&self) -> Result<(), String> {
        if type_slot(self.resource_type).is_none() {
            return Err(format!("Invalid resourceType {}", self.resource_type));
        }
        if !matches!(
            self.pattern_type,
            PatternType::Literal | PatternType::Prefixed
        ) {
            return Err(format!("Invalid patternType {}", self.pattern_type));
        }
        if matches!(self.operation, AclOperation::Unknown | AclOperation::Any) {
            return Err(format!("Invalid operation {}", self.operation));
        }
        if !matches!(self.permission, AclPermission::Allow | AclPermission::Deny) {
            return Err(format!("Invalid permissionType {}", self.permission));
        }
        if self.resource_type == ResourceType::Cluster && self.resource_name != CLUSTER_NAME {
            return Err(format!(
                "The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
            ));
        }
        if self.resource_name.is_empty() {
            return Err("Invalid empty resource name".into());
        }
        if !self.principal.contains(':') {
            return Err(format!(
                "Could not parse principal from `{}` (no colon is present separating the principal type from the principal name)",
                self.principal
            ));
        }
        Ok(())
    }
}

impl fmt::Display for AclBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "(pattern=ResourcePattern(resourceType={}, name={}, patternType={}), entry=(principal={}, host={}, operation={}, permissionType={}))",
            self.resource_type,
            self.resource_name,
            self.pattern_type,
            self.principal,
            self.host,
            self.operation,
            self.permission
        )
    }
}

/// A DescribeAcls / DeleteAcls filter (Kafka's `AclBindingFilter`): None
/// and ANY match everything.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclBindingFilter {
    pub resource_type: ResourceType,
    pub resource_name: Option<String>,
    pub pattern_type: PatternType,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: AclOperation,
    pub permission: AclPermission,
}

impl AclBindingFilter {
    /// Kafka refuses a filter with an UNKNOWN element (INVALID_REQUEST:
    /// `DescribeAclsRequest.validate`, `AclBindingFilter.findIndefiniteField`).
    pub fn validate(&self) -> Result<(), String> {
        if self.resource_type == ResourceType::Unknown {
            return Err("Filter contain UNKNOWN elements".into());
        }
        if self.pattern_type == PatternType::Unknown {
            return Err("Filter contain UNKNOWN elements".into());
        }
        if self.operation == AclOperation::Unknown || self.permission == AclPermission::Unknown {
            return Err("Filter contain UNKNOWN elements".into());
        }
        Ok(())
    }

    /// Whether `b` passes the filter (`ResourcePatternFilter.matches` and
    /// `AccessControlEntryFilter.matches`). MATCH selects every pattern
    /// that would apply to the named resource: the LITERAL name, the
    /// LITERAL `*` and every PREFIXED prefix of it.
    pub fn matches(&self, b: &AclBinding) -> bool {
        if self.resource_type != ResourceType::Any && self.resource_type != b.resource_type {
            return false;
        }
        if !matches!(self.pattern_type, PatternType::Any | PatternType::Match)
            && self.pattern_type != b.pattern_type
        {
            return false;
        }
        let name_ok = match &self.resource_name {
            None => true,
            Some(name)
                if self.pattern_type == PatternType::Any || self.pattern_type == b.pattern_type =>
            {
                *name == b.resource_name
            }
            Some(name) => match b.pattern_type {
                PatternType::Literal => *name == b.resource_name || b.resource_name == WILDCARD,
                PatternType::Prefixed => name.starts_with(&b.resource_name),
                _ => false,
            },
        };
        name_ok
            && self.principal.as_ref().is_none_or(|p| *p == b.principal)
            && self.host.as_ref().is_none_or(|h| *h == b.host)
            && (self.operation == AclOperation::Any || self.operation == b.operation)
            && (self.permission == AclPermission::Any || self.permission == b.permission)
    }
}

/// One access control entry in the index, split so that matching a
/// principal compares two strings without formatting anything.
#[derive(Clone, Debug)]
struct Entry {
    principal_type: Box<str>,
    /// `*` for the wildcard principal.
    principal_name: Box<str>,
    /// None for `*`.
    host: Option<IpAddr>,
    /// A host string that is not an IP (never matches a client address,
    /// but Kafka stores it, so it is kept to be listed).
    host_unparsed: bool,
    operation: AclOperation,
    permission: AclPermission,
}

impl Entry {
    fn new(b: &AclBinding) -> Entry {
        let (principal_type, principal_name) =
            b.principal.split_once(':').unwrap_or((&b.principal, ""));
        let (host, host_unparsed) = if b.host == WILDCARD {
            (None, false)
        } else {
            match b.host.parse::<IpAddr>() {
                Ok(ip) => (Some(ip), false),
                Err(_) => (None, true),
            }
        };
        Entry {
            principal_type: principal_type.into(),
            principal_name: principal_name.into(),
            host,
            host_unparsed,
            operation: b.operation,
            permission: b.permission,
        }
    }

    /// `StandardAuthorizerData.findResult`: Some(result) when the entry
    /// applies to this principal, host and operation.
    fn result(&self, who: &Principal, host: Option<IpAddr>, op: AclOperation) -> Option<bool> {
        if *self.principal_type != *who.principal_type
            || (*self.principal_name != *WILDCARD && *self.principal_name != *who.name)
        {
            return None;
        }
        if self.host_unparsed {
            return None;
        }
        if let Some(h) = self.host {
            if host != Some(h) {
                return None;
            }
        }
        let allow = self.permission == AclPermission::Allow;
        if self.operation != AclOperation::All {
            let applies = if allow {
                match op {
                    AclOperation::Describe => matches!(
                        self.operation,
                        AclOperation::Describe
                            | AclOperation::Read
                            | AclOperation::Write
                            | AclOperation::Delete
                            | AclOperation::Alter
                    ),
                    AclOperation::DescribeConfigs => matches!(
                        self.operation,
                        AclOperation::DescribeConfigs | AclOperation::AlterConfigs
                    ),
                    _ => self.operation == op,
                }
            } else {
                self.operation == op
            };
            if !applies {
                return None;
            }
        }
        Some(allow)
    }
}

/// The bindings of one resource type, indexed by pattern.
#[derive(Clone, Debug, Default)]
struct TypeIndex {
    /// LITERAL bindings by name (`*` included).
    literal: HashMap<Box<str>, Vec<Entry>>,
    /// PREFIXED bindings by prefix.
    prefixed: HashMap<Box<str>, Vec<Entry>>,
    /// The distinct byte lengths of the prefixes in `prefixed`, ascending.
    prefix_lens: Vec<usize>,
}

/// What the ACLs say about one (resource, principal, host, operation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The principal is a super user.
    SuperUser,
    /// A matching ALLOW and no matching DENY.
    Allowed,
    /// A matching DENY.
    Denied,
    /// ACLs exist on the resource but none allows this.
    NoMatch,
    /// No ACL exists on the resource: `allow.everyone.if.no.acl.found`.
    NoAcls { allowed: bool },
}

impl Decision {
    pub fn allowed(self) -> bool {
        matches!(
            self,
            Decision::SuperUser | Decision::Allowed | Decision::NoAcls { allowed: true }
        )
    }
}

/// Broker settings of the authorizer (Kafka's `super.users` and
/// `allow.everyone.if.no.acl.found`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthorizerSettings {
    /// Principals (`User:name`) allowed everything.
    pub super_users: HashSet<String>,
    pub allow_everyone_if_no_acl_found: bool,
}

impl AuthorizerSettings {
    /// Parses Kafka's `super.users` value, `User:a;User:b`.
    pub fn parse_super_users(text: &str) -> Result<HashSet<String>, String> {
        let mut out = HashSet::new();
        for p in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            if !p.contains(':') {
                return Err(format!(
                    "super user `{p}` is not a principal `type:name` (e.g. User:admin)"
                ));
            }
            out.insert(p.to_string());
        }
        Ok(out)
    }

    /// Compares `type:name` without formatting the principal (no
    /// allocation on the hot path; super-user lists are a few entries).
    fn is_super(&self, who: &Principal) -> bool {
        self.super_users.iter().any(|s| {
            s.split_once(':')
                .is_some_and(|(t, n)| t == who.principal_type && n == who.name)
        })
    }
}

/// Every ACL of the cluster: the set as bound (for DescribeAcls and
/// DeleteAcls) and an index for [`Self::authorize`]. Immutable; changes
/// build a new one ([`Self::with_changes`]).
#[derive(Clone, Debug, Default)]
pub struct AclSnapshot {
    bindings: BTreeSet<AclBinding>,
    by_type: [TypeIndex; CONCRETE_TYPES],
}

impl AclSnapshot {
    /// An index of `bindings`.
    pub fn new(bindings: BTreeSet<AclBinding>) -> AclSnapshot {
        let mut by_type: [TypeIndex; CONCRETE_TYPES] = Default::default();
        for b in &bindings {
            let Some(slot) = type_slot(b.resource_type) else {
                continue;
            };
            let index = &mut by_type[slot];
            let entry = Entry::new(b);
            match b.pattern_type {
                PatternType::Literal => index
                    .literal
                    .entry(b.resource_name.as_str().into())
                    .or_default()
                    .push(entry),
                PatternType::Prefixed => index
                    .prefixed
                    .entry(b.resource_name.as_str().into())
                    .or_default()
                    .push(entry),
                _ => continue,
            }
        }
        for index in &mut by_type {
            let mut lens: Vec<usize> = index.prefixed.keys().map(|k| k.len()).collect();
            lens.sort_unstable();
            lens.dedup();
            index.prefix_lens = lens;
        }
        AclSnapshot { bindings, by_type }
    }

    /// A snapshot with `removed` taken out and `added` put in.
    pub fn with_changes(&self, added: &[AclBinding], removed: &[AclBinding]) -> Arc<AclSnapshot> {
        let mut bindings = self.bindings.clone();
        for b in removed {
            bindings.remove(b);
        }
        bindings.extend(added.iter().cloned());
        Arc::new(AclSnapshot::new(bindings))
    }

    pub fn len(&self) -> usize {
        self.bindings.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bindings.is_empty()
    }

    pub fn contains(&self, b: &AclBinding) -> bool {
        self.bindings.contains(b)
    }

    /// The bindings `filter` matches, in a stable order.
    pub fn matching<'a>(
        &'a self,
        filter: &'a AclBindingFilter,
    ) -> impl Iterator<Item = &'a AclBinding> + 'a {
        self.bindings.iter().filter(move |b| filter.matches(b))
    }

    /// Kafka's `authorize` for one action on the resource `resource_type`
    /// `name`, by `who` connecting from `host`.
    pub fn authorize(
        &self,
        settings: &AuthorizerSettings,
        who: &Principal,
        host: Option<IpAddr>,
        op: AclOperation,
        resource_type: ResourceType,
        name: &str,
    ) -> Decision {
        if settings.is_super(who) {
            return Decision::SuperUser;
        }
        let Some(slot) = type_slot(resource_type) else {
            return Decision::NoMatch;
        };
        let index = &self.by_type[slot];
        let mut found = false;
        let mut allowed = false;
        let mut check = |entries: Option<&Vec<Entry>>| -> bool {
            let Some(entries) = entries else {
                return false;
            };
            found = true;
            for e in entries {
                match e.result(who, host, op) {
                    Some(true) => allowed = true,
                    Some(false) => return true,
                    None => {}
                }
            }
            false
        };
        if check(index.literal.get(name)) {
            return Decision::Denied;
        }
        if name != WILDCARD && check(index.literal.get(WILDCARD)) {
            return Decision::Denied;
        }
        for &len in &index.prefix_lens {
            if len > name.len() {
                break;
            }
            let Some(prefix) = name.get(..len) else {
                continue; // not a char boundary: no prefix of that length
            };
            if check(index.prefixed.get(prefix)) {
                return Decision::Denied;
            }
        }
        if allowed {
            Decision::Allowed
        } else if found {
            Decision::NoMatch
        } else {
            Decision::NoAcls {
                allowed: settings.allow_everyone_if_no_acl_found,
            }
        }
    }

    /// Kafka's `Authorizer.authorizeByResourceType` (KIP-679): whether `who`
    /// may do `op` on at least one resource of `resource_type`: allowed by
    /// some ALLOW binding that no DENY of the same or a shorter prefix (or
    /// the `*` literal) takes away. A super user, or a principal allowed on
    /// a resource no ACL names (`allow.everyone.if.no.acl.found`), may.
    pub fn authorize_any(
        &self,
        settings: &AuthorizerSettings,
        who: &Principal,
        host: Option<IpAddr>,
        op: AclOperation,
        resource_type: ResourceType,
    ) -> bool {
        // Kafka checks a hard-coded name first, so super users and the
        // no-ACL default apply.
        if self
            .authorize(settings, who, host, op, resource_type, "hardcode")
            .allowed()
        {
            return true;
        }
        let Some(slot) = type_slot(resource_type) else {
            return false;
        };
        let index = &self.by_type[slot];
        let deny_literals: HashSet<&str> = index
            .literal
            .iter()
            .filter(|(_, es)| es.iter().any(|e| e.result(who, host, op) == Some(false)))
            .map(|(k, _)| &**k)
            .collect();
        if deny_literals.contains(WILDCARD) {
            return false;
        }
        let deny_prefixes: Vec<&str> = index
            .prefixed
            .iter()
            .filter(|(_, es)| es.iter().any(|e| e.result(who, host, op) == Some(false)))
            .map(|(k, _)| &**k)
            .collect();
        let dominated = |name: &str| deny_prefixes.iter().any(|p| name.starts_with(p));
        for (name, es) in &index.literal {
            if es.iter().any(|e| e.result(who, host, op) == Some(true))
                && (&**name == WILDCARD || (!deny_literals.contains(&**name) && !dominated(name)))
            {
                return true;
            }
        }
        for (prefix, es) in &index.prefixed {
            if es.iter().any(|e| e.result(who, host, op) == Some(true)) && !dominated(prefix) {
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(
        rt: ResourceType,
        name: &str,
        pt: PatternType,
        principal: &str,
        op: AclOperation,
        perm: AclPermission,
    ) -> AclBinding {
        AclBinding {
            resource_type: rt,
            resource_name: name.into(),
            pattern_type: pt,
            principal: principal.into(),
            host: WILDCARD.into(),
            operation: op,
            permission: perm,
        }
    }

    fn topic(name: &str, pt: PatternType, op: AclOperation, perm: AclPermission) -> AclBinding {
        acl(ResourceType::Topic, name, pt, "User:alice", op, perm)
    }

    fn snap(bs: Vec<AclBinding>) -> AclSnapshot {
        AclSnapshot::new(bs.into_iter().collect())
    }

    fn alice() -> Principal {
        Principal::user("alice")
    }

    fn may(s: &AclSnapshot, op: AclOperation, name: &str) -> bool {
        s.authorize(
            &AuthorizerSettings::default(),
            &alice(),
            None,
            op,
            ResourceType::Topic,
            name,
        )
        .allowed()
    }

    use AclOperation as Op;
    use AclPermission::{Allow, Deny};
    use PatternType::{Literal, Prefixed};

    #[test]
    fn literal_prefixed_and_wildcard_patterns() {
        let s = snap(vec![
            topic("orders", Literal, Op::Write, Allow),
            topic("logs-", Prefixed, Op::Read, Allow),
        ]);
        assert!(may(&s, Op::Write, "orders"));
        assert!(!may(&s, Op::Write, "orders2"), "literal is exact");
        assert!(!may(&s, Op::Read, "orders"), "another operation");
        assert!(may(&s, Op::Read, "logs-a"));
        assert!(may(&s, Op::Read, "logs-"));
        assert!(!may(&s, Op::Read, "logs"));
        let s = snap(vec![topic("*", Literal, Op::Read, Allow)]);
        assert!(may(&s, Op::Read, "anything"));
        // A PREFIXED `*` is a prefix like any other, not a wildcard.
        let s = snap(vec![topic("*", Prefixed, Op::Read, Allow)]);
        assert!(!may(&s, Op::Read, "anything"));
    }

    #[test]
    fn implied_operations_apply_to_allow_only() {
        let s = snap(vec![
            topic("t", Literal, Op::Write, Allow),
            topic("c", Literal, Op::AlterConfigs, Allow),
        ]);
        assert!(may(&s, Op::Describe, "t"), "WRITE implies DESCRIBE");
        assert!(!may(&s, Op::DescribeConfigs, "t"));
        assert!(may(&s, Op::DescribeConfigs, "c"));
        assert!(
            !may(&s, Op::Describe, "c"),
            "ALTER_CONFIGS does not imply DESCRIBE"
        );
        // DENY READ does not deny DESCRIBE.
        let s = snap(vec![
            topic("t", Literal, Op::All, Allow),
            topic("t", Literal, Op::Read, Deny),
        ]);
        assert!(!may(&s, Op::Read, "t"));
        assert!(may(&s, Op::Describe, "t"));
        assert!(may(&s, Op::Write, "t"), "ALL allows everything");
    }

    #[test]
    fn deny_wins_from_any_pattern() {
        let s = snap(vec![
            topic("t", Literal, Op::Read, Allow),
            topic("t", Prefixed, Op::Read, Deny),
        ]);
        assert!(!may(&s, Op::Read, "t"));
        assert!(!may(&s, Op::Read, "tx"));
        let s = snap(vec![
            topic("tx", Prefixed, Op::Read, Allow),
            topic("*", Literal, Op::All, Deny),
        ]);
        assert!(!may(&s, Op::Read, "txa"));
    }

    #[test]
    fn principals_hosts_super_users_and_the_no_acl_default() {
        let mut b = topic("t", Literal, Op::Read, Allow);
        b.principal = "User:*".into();
        let mut h = topic("h", Literal, Op::Read, Allow);
        h.host = "10.0.0.1".into();
        let s = snap(vec![b, h]);
        let bob = Principal::user("bob");
        let st = AuthorizerSettings::default();
        let d = |who: &Principal, host: Option<IpAddr>, name: &str| {
            s.authorize(&st, who, host, Op::Read, ResourceType::Topic, name)
        };
        assert_eq!(d(&bob, None, "t"), Decision::Allowed, "User:* matches bob");
        assert_eq!(d(&alice(), None, "h"), Decision::NoMatch);
        assert_eq!(
            d(&alice(), Some("10.0.0.1".parse().unwrap()), "h"),
            Decision::Allowed
        );
        assert_eq!(
            d(&alice(), None, "none"),
            Decision::NoAcls { allowed: false }
        );
        let st = AuthorizerSettings {
            super_users: AuthorizerSettings::parse_super_users("User:root; User:bob").unwrap(),
            allow_everyone_if_no_acl_found: true,
        };
        assert_eq!(
            s.authorize(&st, &alice(), None, Op::Read, ResourceType::Topic, "none"),
            Decision::NoAcls { allowed: true }
        );
        assert_eq!(
            s.authorize(&st, &alice(), None, Op::Read, ResourceType::Topic, "h"),
            Decision::NoMatch,
            "ACLs on the resource: the default does not apply"
        );
        assert_eq!(
            s.authorize(&st, &bob, None, Op::Delete, ResourceType::Topic, "h"),
            Decision::SuperUser
        );
        assert!(AuthorizerSettings::parse_super_users("root").is_err());
    }

    #[test]
    fn authorize_any_follows_kip_679() {
        let st = AuthorizerSettings::default();
        let any =
            |s: &AclSnapshot| s.authorize_any(&st, &alice(), None, Op::Write, ResourceType::Topic);
        assert!(!any(&snap(vec![])));
        assert!(any(&snap(vec![topic("t", Literal, Op::Write, Allow)])));
        assert!(!any(&snap(vec![
            topic("t", Literal, Op::Write, Allow),
            topic("t", Literal, Op::Write, Deny),
        ])));
        assert!(!any(&snap(vec![
            topic("ab", Prefixed, Op::Write, Allow),
            topic("a", Prefixed, Op::Write, Deny),
        ])));
        assert!(any(&snap(vec![
            topic("ab", Prefixed, Op::Write, Allow),
            topic("abc", Prefixed, Op::Write, Deny),
        ])));
        assert!(!any(&snap(vec![
            topic("t", Literal, Op::Write, Allow),
            topic("*", Literal, Op::Write, Deny),
        ])));
    }

    #[test]
    fn filters_match_as_kafka_does() {
        let lit = topic("orders", Literal, Op::Read, Allow);
        let wild = topic("*", Literal, Op::Read, Allow);
        let pre = topic("ord", Prefixed, Op::Read, Allow);
        let f = |pt: PatternType, name: Option<&str>| AclBindingFilter {
            resource_type: ResourceType::Any,
            resource_name: name.map(Into::into),
            pattern_type: pt,
            principal: None,
            host: None,
            operation: Op::Any,
            permission: AclPermission::Any,
        };
        let m = |f: &AclBindingFilter| {
            [&lit, &wild, &pre]
                .iter()
                .map(|b| f.matches(b))
                .collect::<Vec<_>>()
        };
        assert_eq!(m(&f(PatternType::Any, None)), [true, true, true]);
        assert_eq!(
            m(&f(PatternType::Any, Some("orders"))),
            [true, false, false]
        );
        assert_eq!(
            m(&f(PatternType::Match, Some("orders"))),
            [true, true, true]
        );
        assert_eq!(m(&f(Literal, None)), [true, true, false]);
        assert_eq!(m(&f(Prefixed, Some("ord"))), [false, false, true]);
        let mut bad = f(PatternType::Unknown, None);
        assert!(bad.validate().is_err());
        bad.pattern_type = PatternType::Any;
        assert!(bad.validate().is_ok());
    }

    #[test]
    fn creation_is_validated_as_kafka_does() {
        let ok = topic("t", Literal, Op::Read, Allow);
        assert!(ok.validate().is_ok());
        let mut b = ok.clone();
        b.resource_type = ResourceType::Cluster;
        assert!(b.validate().unwrap_err().contains("kafka-cluster"));
        let mut b = ok.clone();
        b.pattern_type = PatternType::Match;
        assert!(b.validate().is_err());
        let mut b = ok.clone();
        b.operation = Op::Any;
        assert!(b.validate().is_err());
        let mut b = ok.clone();
        b.principal = "alice".into();
        assert!(b.validate().is_err());
        let mut b = ok;
        b.resource_name = String::new();
        assert!(b.validate().is_err());
    }
}

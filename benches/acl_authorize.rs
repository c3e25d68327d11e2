//! What one authorization costs on the hot path: `AclSnapshot::authorize`
//! (what Produce and Fetch call once per topic of a request, with
//! `--authorizer standard`) against a snapshot of 1000 ACLs, for an allowed
//! topic (a LITERAL hit), a topic allowed by a PREFIXED binding, a topic no
//! binding names (the no-ACL default), and a DENY; plus the same look-up
//! with 10 ACLs, to show the cost does not grow with the ACLs on other
//! resources.
//!
//! The 1000 ACLs: 400 LITERAL topic bindings (`topic-N`, READ and WRITE for
//! 200 principals), 200 PREFIXED topic bindings (`team-N-`, 20 distinct
//! prefix lengths), 300 group bindings, 99 transactional-id bindings and
//! a DENY.
//!
//! Run: `cargo bench --bench acl_authorize` (or under callgrind on a noisy
//! machine: instruction counts do not drift).

use criterion::{criterion_group, criterion_main, Criterion};
use fjord::auth::acl::{
    AclBinding, AclOperation, AclPermission, AclSnapshot, AuthorizerSettings, PatternType,
    ResourceType,
};
use fjord::auth::Principal;
use std::collections::BTreeSet;
use std::hint::black_box;

fn binding(
    rt: ResourceType,
    name: String,
    pt: PatternType,
    principal: String,
    op: AclOperation,
    perm: AclPermission,
) -> AclBinding {
    AclBinding {
        resource_type: rt,
        resource_name: name,
        pattern_type: pt,
        principal,
        host: "*".into(),
        operation: op,
        permission: perm,
    }
}

fn snapshot(n: usize) -> AclSnapshot {
    let mut set = BTreeSet::new();
    let mut i = 0;
    while set.len() < n {
        let user = format!("User:u{}", i % 200);
        let b = match i % 10 {
            0..=3 => binding(
                ResourceType::Topic,
                format!("topic-{i}"),
                PatternType::Literal,
                user,
                if i % 2 == 0 {
                    AclOperation::Write
                } else {
                    AclOperation::Read
                },
                AclPermission::Allow,
            ),
            4 | 5 => binding(
                ResourceType::Topic,
                format!("team-{}-", "x".repeat(i % 20)),
                PatternType::Prefixed,
                format!("User:u{i}"),
                AclOperation::Read,
                AclPermission::Allow,
            ),
            6..=8 => binding(
                ResourceType::Group,
                format!("group-{i}"),
                PatternType::Literal,
                user,
                AclOperation::Read,
                AclPermission::Allow,
            ),
            _ => binding(
                ResourceType::TransactionalId,
                format!("tx-{i}"),
                PatternType::Literal,
                user,
                AclOperation::Write,
                AclPermission::Allow,
            ),
        };
        set.insert(b);
        i += 1;
    }
    // The principal measured: WRITE on `orders`, READ on `logs-` prefixed,
    // a DENY on `orders-secret`.
    set.insert(binding(
        ResourceType::Topic,
        "orders".into(),
        PatternType::Literal,
        "User:alice".into(),
        AclOperation::Write,
        AclPermission::Allow,
    ));
    set.insert(binding(
        ResourceType::Topic,
        "logs-".into(),
        PatternType::Prefixed,
        "User:alice".into(),
        AclOperation::Read,
        AclPermission::Allow,
    ));
    set.insert(binding(
        ResourceType::Topic,
        "orders-secret".into(),
        PatternType::Literal,
        "User:alice".into(),
        AclOperation::All,
        AclPermission::Deny,
    ));
    AclSnapshot::new(set)
}

fn bench(c: &mut Criterion) {
    let settings = AuthorizerSettings::default();
    let alice = Principal::user("alice");
    let host = Some("10.1.2.3".parse().expect("ip"));
    for n in [10, 1000] {
        let snap = snapshot(n);
        let mut g = c.benchmark_group(format!("acl_authorize/{n}_acls"));
        for (case, op, topic) in [
            ("literal_allow", AclOperation::Write, "orders"),
            ("prefixed_allow", AclOperation::Read, "logs-app-1"),
            ("no_acl", AclOperation::Write, "unnamed-topic"),
            ("deny", AclOperation::Write, "orders-secret"),
        ] {
            g.bench_function(case, |b| {
                b.iter(|| {
                    snap.authorize(
                        black_box(&settings),
                        black_box(&alice),
                        host,
                        op,
                        ResourceType::Topic,
                        black_box(topic),
                    )
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);

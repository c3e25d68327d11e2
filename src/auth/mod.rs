//! Who is on the other end of a connection: the principal and the client
//! address that authentication (SASL, TLS client certificates) establishes
//! and that authorization (ACLs) and the audit log read.
//!
//! A connection owns one [`Session`] from accept to close; every request it
//! dispatches sees the same `Rc<Session>`, so a principal set by a
//! SaslAuthenticate (or a re-authentication, KIP-368) applies to the
//! requests read after it, and never to another connection. Until a
//! listener authenticates, the principal is Kafka's `User:ANONYMOUS`, which
//! is what a PLAINTEXT listener's clients are in Kafka.
//!
//! A session also knows the listener its connection came in on (Metadata,
//! FindCoordinator and DescribeCluster advertise that listener's endpoints,
//! as Kafka does) and, on a SASL listener, the connection's SASL state
//! ([`sasl`]; mechanisms in [`scram`]; the credentials, in the metadata
//! image's SCRAM store, are handed in by the caller, as this layer sits below
//! `metadata`).
//!
//! On an SSL listener a verified client certificate sets the principal
//! once, after the handshake: `User:` + its subject as Kafka prints it
//! ([`x500`]).
//!
//! [`acl`] holds Kafka's ACL model and the authorizer's decision; the
//! handlers ask it through `handlers::authz`.

pub mod acl;
pub mod audit;
pub mod sasl;
pub mod scram;
pub mod x500;

use std::cell::RefCell;
use std::fmt;
use std::net::SocketAddr;
use std::rc::Rc;

/// A Kafka principal, `type:name` (Kafka's `KafkaPrincipal`); the type is
/// `User` for every principal fjord's authenticators produce.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Principal {
    pub principal_type: String,
    pub name: String,
}

/// Kafka's `KafkaPrincipal.USER_TYPE`.
pub const USER_TYPE: &str = "User";

impl Principal {
    /// `User:name`.
    pub fn user(name: impl Into<String>) -> Self {
        Self {
            principal_type: USER_TYPE.to_string(),
            name: name.into(),
        }
    }

    /// `User:ANONYMOUS`, the principal of an unauthenticated connection.
    pub fn anonymous() -> Self {
        Self::user("ANONYMOUS")
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.principal_type, self.name)
    }
}

/// One connection's identity (shard-local, shared by its reader and its
/// requests' tasks).
#[derive(Debug)]
pub struct Session {
    /// The client's address (None if the socket could not tell).
    pub peer: Option<SocketAddr>,
    principal: RefCell<Rc<Principal>>,
    /// The index of the connection's listener in `BrokerConfig::listeners`.
    pub listener: usize,
    /// The SASL state, on a SASL listener only.
    pub sasl: Option<RefCell<sasl::SaslConnection>>,
}

impl Session {
    /// A new connection's session: anonymous until authenticated.
    pub fn new(peer: Option<SocketAddr>) -> Rc<Self> {
        Self::on_listener(peer, 0, false)
    }

    /// A new connection's session on listener `listener`; `sasl`: the
    /// listener authenticates with SASL.
    pub fn on_listener(peer: Option<SocketAddr>, listener: usize, sasl: bool) -> Rc<Self> {
        Rc::new(Self {
            peer,
            principal: RefCell::new(Rc::new(Principal::anonymous())),
            listener,
            sasl: sasl.then(|| RefCell::new(sasl::SaslConnection::new())),
        })
    }

    /// The principal requests are served as now.
    pub fn principal(&self) -> Rc<Principal> {
        self.principal.borrow().clone()
    }

    /// Sets the principal after a successful authentication.
    pub fn set_principal(&self, principal: Principal) {
        *self.principal.borrow_mut() = Rc::new(principal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_session_is_anonymous_until_a_principal_is_set() {
        let s = Session::new(None);
        assert_eq!(s.principal().to_string(), "User:ANONYMOUS");
        s.set_principal(Principal::user("alice"));
        assert_eq!(s.principal().to_string(), "User:alice");
    }
}

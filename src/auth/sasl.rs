//! The SASL state of one connection on a SASL_PLAINTEXT listener, as
//! Kafka's `SaslServerAuthenticator` and `KafkaChannel` keep it: which
//! requests may be served now, and what SaslHandshake and SaslAuthenticate
//! do to it.
//!
//! The states, in order:
//! - `Handshake`: only ApiVersions and SaslHandshake are served; anything
//!   else closes the connection (Kafka: "Unexpected Kafka request of type
//!   X during SASL handshake").
//! - `Authenticate`: a mechanism was chosen; only SaslAuthenticate is
//!   served (PLAIN: one round; SCRAM: two, see `auth::scram`). A failure is
//!   answered SASL_AUTHENTICATION_FAILED (58) with Kafka's message, then
//!   the connection closes.
//! - `Authenticated`: every request is served as the principal. With
//!   `--connections-max-reauth-ms` > 0 the session expires that long after
//!   authenticating (SaslAuthenticate v1+ tells the client,
//!   `session_lifetime_ms`); a SaslHandshake then starts a re-authentication
//!   (KIP-368; at most one a second, same mechanism and same principal),
//!   and any other request after expiry closes the connection.
//! - `RawTokens`: SaslHandshake v0 was used, so the next frames are bare
//!   SASL tokens without a Kafka header (pre-KIP-152 clients).
//!
//! The connection's reader calls [`SaslConnection::gate`] for every request
//! before dispatching it and handles the SASL requests in arrival order
//! before reading the next frame, so a pipelining client cannot have a
//! request served before the authentication it follows is decided.
//!
//! Bounded: a frame read before authentication is at most
//! `SASL_SERVER_MAX_RECEIVE_BYTES` (Kafka's `sasl.server.max.receive.size`),
//! and the state holds at most one SCRAM exchange.

use super::scram::{ScramCredential, ScramError, ScramMechanism, ScramServer, ScramStep};
use super::Principal;
use std::time::{Duration, Instant};

/// Kafka's `sasl.server.max.receive.size` default: the largest frame
/// accepted from a client that has not authenticated.
pub const SASL_SERVER_MAX_RECEIVE_BYTES: usize = 524_288;
/// Kafka's `KafkaChannel.MIN_REAUTH_INTERVAL_ONE_SECOND_NANOS`.
const REAUTH_INTERVAL_MIN: Duration = Duration::from_secs(1);

/// Kafka's error codes used here.
pub const ILLEGAL_SASL_STATE: i16 = 34;
pub const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
pub const SASL_AUTHENTICATION_FAILED: i16 = 58;

/// A SASL mechanism fjord serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    Plain,
    Scram(ScramMechanism),
}

impl Mechanism {
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::Scram(m) => m.name(),
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "PLAIN" => Some(Mechanism::Plain),
            other => ScramMechanism::from_name(other).map(Mechanism::Scram),
        }
    }
}

/// What SASL listeners accept (`--sasl-enabled-mechanisms`,
/// `--connections-max-reauth-ms`); identical on every shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SaslSettings {
    pub mechanisms: Vec<Mechanism>,
    /// 0: sessions never expire (Kafka's default).
    pub connections_max_reauth_ms: u64,
}

/// What to do with a request, decided before it is dispatched.
#[derive(Debug, PartialEq, Eq)]
pub enum Gate {
    /// Serve it as usual (as the session's principal).
    Serve,
    /// A SaslHandshake or SaslAuthenticate: answer it through this state.
    Sasl,
    /// Close the connection without answering; the reason is logged.
    Close(String),
}

#[derive(Debug)]
enum State {
    Handshake {
        /// ApiVersions is still allowed (before the handshake only).
        versions_allowed: bool,
        reauth: Option<Previous>,
    },
    Authenticate {
        mechanism: Mechanism,
        /// Boxed: the exchange's messages make it the largest state.
        scram: Option<Box<ScramServer>>,
        reauth: Option<Previous>,
    },
    Authenticated(Previous),
    /// Failed: the connection is closing.
    Failed,
}

/// A successful authentication (kept for re-authentication).
#[derive(Debug, Clone)]
struct Previous {
    mechanism: Mechanism,
    user: String,
    expires_at: Option<Instant>,
    reauth_started_at: Option<Instant>,
}

/// The SASL state of one connection (shard-local, owned by its session).
#[derive(Debug)]
pub struct SaslConnection {
    state: State,
    /// The client used SaslAuthenticate v1+ (it can re-authenticate).
    client_supports_reauth: bool,
    /// SaslHandshake v0 was used: SaslAuthenticate frames are raw tokens.
    raw_tokens: bool,
}

/// The answer to a SaslHandshake.
#[derive(Debug, PartialEq, Eq)]
pub struct HandshakeAnswer {
    pub error_code: i16,
    pub mechanisms: Vec<&'static str>,
    /// Close the connection once this answer is written.
    pub close: bool,
}

/// The answer to a SaslAuthenticate.
#[derive(Debug, PartialEq, Eq)]
pub struct AuthenticateAnswer {
    pub error_code: i16,
    pub error_message: Option<String>,
    pub auth_bytes: Vec<u8>,
    pub session_lifetime_ms: i64,
    /// Close the connection once this answer is written.
    pub close: bool,
    /// What the audit log says of this step (None while an exchange goes on).
    pub outcome: Option<AuthOutcome>,
}

/// How an authentication ended, for the audit log.
#[derive(Debug, PartialEq, Eq, Clone)]
pub enum AuthOutcome {
    Authenticated {
        principal: Principal,
        mechanism: &'static str,
        reauthentication: bool,
    },
    Failed {
        /// The user the client named, if it got that far (never a password).
        user: Option<String>,
        mechanism: &'static str,
        reason: String,
    },
}

/// Where a PLAIN or SCRAM credential is looked up.
pub trait Credentials {
    fn scram(&self, user: &str, mechanism: ScramMechanism) -> Option<ScramCredential>;
    /// Whether `password` is `user`'s (PLAIN).
    fn plain(&self, user: &str, password: &str) -> bool;
}

impl Default for SaslConnection {
    fn default() -> Self {
        Self::new()
    }
}

impl SaslConnection {
    pub fn new() -> Self {
        Self {
            state: State::Handshake {
                versions_allowed: true,
                reauth: None,
            },
            client_supports_reauth: false,
            raw_tokens: false,
        }
    }

    /// The mechanism of the exchange under way, if one is.
    pub fn authenticating_with(&self) -> Option<Mechanism> {
        match &self.state {
            State::Authenticate { mechanism, .. } => Some(*mechanism),
            _ => None,
        }
    }

    /// Whether the connection has authenticated (and is not re-authenticating).
    pub fn authenticated(&self) -> bool {
        matches!(self.state, State::Authenticated(_))
    }

    /// The largest frame to accept now: `SASL_SERVER_MAX_RECEIVE_BYTES`
    /// before the first authentication, else `otherwise`.
    pub fn frame_max_bytes(&self, otherwise: usize) -> usize {
        match &self.state {
            State::Authenticated(_) => otherwise,
            State::Handshake {
                reauth: Some(_), ..
            }
            | State::Authenticate {
                reauth: Some(_), ..
            } => otherwise,
            _ => SASL_SERVER_MAX_RECEIVE_BYTES.min(otherwise),
        }
    }

    /// After SaslHandshake v0, SASL tokens come as bare frames.
    pub fn expects_raw_token(&self) -> bool {
        self.raw_tokens && matches!(self.state, State::Authenticate { .. })
    }

    /// What to do with a request of `api_key` arriving at `now`.
    pub fn gate(&mut self, api_key: i16, now: Instant) -> Gate {
        const API_VERSIONS: i16 = 18;
        const SASL_HANDSHAKE: i16 = 17;
        const SASL_AUTHENTICATE: i16 = 36;
        match &mut self.state {
            State::Handshake {
                versions_allowed, ..
            } => match api_key {
                API_VERSIONS if *versions_allowed => {
                    *versions_allowed = false;
                    Gate::Serve
                }
                SASL_HANDSHAKE => Gate::Sasl,
                _ => Gate::Close(format!(
                    "Unexpected Kafka request of type {} during SASL handshake.",
                    api_name(api_key)
                )),
            },
            State::Authenticate { .. } => match api_key {
                SASL_AUTHENTICATE => Gate::Sasl,
                _ => Gate::Close(format!(
                    "Unexpected Kafka request of type {} during SASL authentication.",
                    api_name(api_key)
                )),
            },
            State::Authenticated(prev) => {
                // Kafka's SocketServer: a SaslHandshake may begin a
                // re-authentication (when sessions expire, at most once a
                // second); otherwise an expired session closes.
                if api_key == SASL_HANDSHAKE
                    && prev.expires_at.is_some()
                    && prev
                        .reauth_started_at
                        .is_none_or(|t| now.saturating_duration_since(t) >= REAUTH_INTERVAL_MIN)
                {
                    let mut prev = prev.clone();
                    prev.reauth_started_at = Some(now);
                    self.state = State::Handshake {
                        versions_allowed: false,
                        reauth: Some(prev),
                    };
                    return Gate::Sasl;
                }
                if prev.expires_at.is_some_and(|at| now > at) {
                    return Gate::Close(format!(
                        "the authenticated session of User:{} expired (--connections-max-reauth-ms) and the request ({}) is not a re-authentication",
                        prev.user,
                        api_name(api_key)
                    ));
                }
                // Kafka's KafkaApis answers these ILLEGAL_SASL_STATE after
                // authentication: served by the SASL handler too.
                match api_key {
                    SASL_HANDSHAKE | SASL_AUTHENTICATE => Gate::Sasl,
                    _ => Gate::Serve,
                }
            }
            State::Failed => Gate::Close("authentication failed".into()),
        }
    }

    /// Answers a SaslHandshake of `version` asking for `mechanism`.
    pub fn handshake(
        &mut self,
        settings: &SaslSettings,
        version: i16,
        mechanism: &str,
    ) -> HandshakeAnswer {
        let names = settings.mechanisms.iter().map(|m| m.name()).collect();
        let reauth = match &mut self.state {
            State::Handshake { reauth, .. } => reauth.take(),
            // After authentication without a re-authentication: KafkaApis.
            _ => {
                return HandshakeAnswer {
                    error_code: ILLEGAL_SASL_STATE,
                    mechanisms: Vec::new(),
                    close: false,
                }
            }
        };
        let chosen = Mechanism::from_name(mechanism).filter(|m| settings.mechanisms.contains(m));
        let Some(chosen) = chosen else {
            self.state = State::Failed;
            return HandshakeAnswer {
                error_code: UNSUPPORTED_SASL_MECHANISM,
                mechanisms: names,
                close: true,
            };
        };
        self.raw_tokens = version == 0;
        self.state = State::Authenticate {
            mechanism: chosen,
            scram: match chosen {
                Mechanism::Scram(m) => Some(Box::new(ScramServer::new(m))),
                Mechanism::Plain => None,
            },
            reauth,
        };
        HandshakeAnswer {
            error_code: 0,
            mechanisms: names,
            close: false,
        }
    }

    /// Answers a SaslAuthenticate of `version` carrying `token`, at `now`.
    /// On success the caller sets the session's principal to
    /// `AuthOutcome::Authenticated`'s.
    pub fn authenticate(
        &mut self,
        settings: &SaslSettings,
        version: i16,
        token: &[u8],
        credentials: &dyn Credentials,
        now: Instant,
    ) -> AuthenticateAnswer {
        let State::Authenticate {
            mechanism,
            scram,
            reauth,
        } = &mut self.state
        else {
            return AuthenticateAnswer {
                error_code: ILLEGAL_SASL_STATE,
                error_message: Some(
                    "SaslAuthenticate request received after successful authentication".into(),
                ),
                auth_bytes: Vec::new(),
                session_lifetime_ms: 0,
                close: false,
                outcome: None,
            };
        };
        if version > 0 {
            self.client_supports_reauth = true;
        }
        let mechanism = *mechanism;
        let text = if reauth.is_some() {
            "re-authentication"
        } else {
            "authentication"
        };
        let generic = format!(
            "Authentication failed during {text} due to invalid credentials with SASL mechanism {}",
            mechanism.name()
        );
        // Ok: the user and the final server token; Err: the user named (if
        // any), the message for the client, the reason for the audit log.
        type Failure = (Option<String>, String, String);
        let result: Result<(String, Vec<u8>), Failure> = match mechanism {
            Mechanism::Plain => match parse_plain(token) {
                Err(msg) => Err((None, msg.clone(), msg)),
                Ok((authzid, user, password)) => {
                    if !authzid.is_empty() && authzid != user {
                        let msg = "Authentication failed: Client requested an authorization id that is different from username".to_string();
                        Err((Some(user), msg.clone(), msg))
                    } else if credentials.plain(&user, &password) {
                        Ok((user, Vec::new()))
                    } else {
                        Err((
                            Some(user),
                            "Authentication failed: Invalid username or password".into(),
                            "invalid username or password".into(),
                        ))
                    }
                }
            },
            Mechanism::Scram(m) => {
                let server = scram.as_mut().expect("a SCRAM mechanism has its exchange");
                let mut named = None;
                let step = server.step(token, |user| {
                    named = Some(user.to_string());
                    credentials.scram(user, m)
                });
                match step {
                    Ok(ScramStep::Continue(challenge)) => {
                        return AuthenticateAnswer {
                            error_code: 0,
                            error_message: None,
                            auth_bytes: challenge,
                            session_lifetime_ms: 0,
                            close: false,
                            outcome: None,
                        };
                    }
                    Ok(ScramStep::Done { user, server_final }) => Ok((user, server_final)),
                    Err(ScramError::Credentials(why)) => Err((named, generic.clone(), why.into())),
                    Err(ScramError::Client(msg)) => Err((named, msg.clone(), msg)),
                }
            }
        };
        let reauth = reauth.take();
        match result {
            Ok((user, final_bytes)) => {
                if let Some(prev) = &reauth {
                    if prev.user != user {
                        let msg = format!(
                            "Cannot change principals during re-authentication from User.{}: User.{}",
                            prev.user, user
                        );
                        return self.fail(Some(user), mechanism, msg.clone(), msg);
                    }
                    if prev.mechanism != mechanism {
                        let msg = format!(
                            "SASL mechanism '{}' requested by client is not supported for re-authentication of mechanism '{}'",
                            mechanism.name(),
                            prev.mechanism.name()
                        );
                        return self.fail(Some(user), mechanism, msg.clone(), msg);
                    }
                }
                let lifetime_ms = settings.connections_max_reauth_ms;
                let expires_at =
                    (lifetime_ms > 0).then(|| now + Duration::from_millis(lifetime_ms));
                self.state = State::Authenticated(Previous {
                    mechanism,
                    user: user.clone(),
                    expires_at,
                    reauth_started_at: reauth.as_ref().and_then(|p| p.reauth_started_at),
                });
                AuthenticateAnswer {
                    error_code: 0,
                    // Kafka's SaslAuthenticateResponseData default: "".
                    error_message: Some(String::new()),
                    auth_bytes: final_bytes,
                    session_lifetime_ms: lifetime_ms.min(i64::MAX as u64) as i64,
                    close: false,
                    outcome: Some(AuthOutcome::Authenticated {
                        principal: Principal::user(user),
                        mechanism: mechanism.name(),
                        reauthentication: reauth.is_some(),
                    }),
                }
            }
            Err((user, message, reason)) => self.fail(user, mechanism, message, reason),
        }
    }

    fn fail(
        &mut self,
        user: Option<String>,
        mechanism: Mechanism,
        message: String,
        reason: String,
    ) -> AuthenticateAnswer {
        self.state = State::Failed;
        AuthenticateAnswer {
            error_code: SASL_AUTHENTICATION_FAILED,
            error_message: Some(message),
            auth_bytes: Vec::new(),
            session_lifetime_ms: 0,
            close: true,
            outcome: Some(AuthOutcome::Failed {
                user,
                mechanism: mechanism.name(),
                reason,
            }),
        }
    }
}

/// A PLAIN token's user and password, if it parses (see [`parse_plain`]).
pub fn plain_user_and_password(token: &[u8]) -> Option<(String, String)> {
    parse_plain(token)
        .ok()
        .map(|(_, user, password)| (user, password))
}

/// RFC 4616's message: authzid NUL authcid NUL passwd (Kafka's
/// `PlainSaslServer` messages for the malformed cases).
fn parse_plain(token: &[u8]) -> Result<(String, String, String), String> {
    let text = std::str::from_utf8(token)
        .map_err(|_| "Invalid SASL/PLAIN response: not UTF-8".to_string())?;
    let parts: Vec<&str> = text.split('\u{0}').collect();
    if parts.len() != 3 {
        return Err(format!(
            "Invalid SASL/PLAIN response: expected 3 tokens, got {}",
            parts.len()
        ));
    }
    if parts[1].is_empty() {
        return Err("Authentication failed: username not specified".into());
    }
    if parts[2].is_empty() {
        return Err("Authentication failed: password not specified".into());
    }
    Ok((parts[0].into(), parts[1].into(), parts[2].into()))
}

/// Kafka's `ApiKeys` enum name of `key` (what its messages print).
fn api_name(key: i16) -> String {
    match kafka_protocol::messages::ApiKey::try_from(key) {
        Ok(k) => {
            // `ApiKey`'s Debug is the CamelCase name; Kafka prints
            // UPPER_SNAKE (`METADATA`, `FIND_COORDINATOR`).
            let camel = format!("{k:?}");
            let mut out = String::with_capacity(camel.len() + 4);
            for (i, c) in camel.chars().enumerate() {
                if c.is_ascii_uppercase() && i > 0 {
                    out.push('_');
                }
                out.push(c.to_ascii_uppercase());
            }
            out
        }
        Err(_) => format!("api key {key}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Store(ScramCredential);
    impl Credentials for Store {
        fn scram(&self, user: &str, _m: ScramMechanism) -> Option<ScramCredential> {
            (user == "alice").then(|| self.0.clone())
        }
        fn plain(&self, user: &str, password: &str) -> bool {
            user == "alice" && ScramMechanism::Sha256.verify_password(&self.0, password)
        }
    }

    fn settings(reauth_ms: u64) -> SaslSettings {
        SaslSettings {
            mechanisms: vec![Mechanism::Plain, Mechanism::Scram(ScramMechanism::Sha256)],
            connections_max_reauth_ms: reauth_ms,
        }
    }

    fn store() -> Store {
        Store(ScramMechanism::Sha256.new_credential("alice-secret", 4096))
    }

    #[test]
    fn only_api_versions_and_sasl_pass_before_authentication() {
        let now = Instant::now();
        let mut c = SaslConnection::new();
        assert_eq!(c.gate(18, now), Gate::Serve);
        assert!(matches!(c.gate(3, now), Gate::Close(m) if m.contains("METADATA")));
        assert_eq!(c.gate(17, now), Gate::Sasl);
        let a = c.handshake(&settings(0), 1, "PLAIN");
        assert_eq!(a.error_code, 0);
        assert_eq!(a.mechanisms, vec!["PLAIN", "SCRAM-SHA-256"]);
        assert!(
            matches!(c.gate(18, now), Gate::Close(_)),
            "ApiVersions only before the handshake"
        );
        assert_eq!(c.gate(36, now), Gate::Sasl);
        let a = c.authenticate(&settings(0), 2, b"\0alice\0alice-secret", &store(), now);
        assert_eq!(a.error_code, 0);
        assert!(c.authenticated());
        assert_eq!(c.gate(3, now), Gate::Serve);
        // After authentication, KafkaApis' answers.
        assert_eq!(c.gate(17, now), Gate::Sasl);
        assert_eq!(
            c.handshake(&settings(0), 1, "PLAIN").error_code,
            ILLEGAL_SASL_STATE
        );
        assert_eq!(
            c.authenticate(&settings(0), 2, b"x", &store(), now)
                .error_code,
            ILLEGAL_SASL_STATE
        );
    }

    #[test]
    fn a_wrong_password_fails_with_kafkas_message_and_closes() {
        let now = Instant::now();
        let mut c = SaslConnection::new();
        c.handshake(&settings(0), 1, "PLAIN");
        let a = c.authenticate(&settings(0), 2, b"\0alice\0nope", &store(), now);
        assert_eq!(a.error_code, SASL_AUTHENTICATION_FAILED);
        assert_eq!(
            a.error_message.as_deref(),
            Some("Authentication failed: Invalid username or password")
        );
        assert!(a.close);
        assert!(matches!(
            a.outcome,
            Some(AuthOutcome::Failed { user: Some(ref u), .. }) if u == "alice"
        ));
        assert!(matches!(c.gate(3, now), Gate::Close(_)));
        let mut c = SaslConnection::new();
        let a = c.handshake(&settings(0), 1, "GSSAPI");
        assert_eq!(a.error_code, UNSUPPORTED_SASL_MECHANISM);
        assert!(a.close);
    }

    #[test]
    fn sessions_expire_and_re_authenticate_with_the_same_principal() {
        let t0 = Instant::now();
        let mut c = SaslConnection::new();
        c.handshake(&settings(1000), 1, "PLAIN");
        let a = c.authenticate(&settings(1000), 2, b"\0alice\0alice-secret", &store(), t0);
        assert_eq!(a.session_lifetime_ms, 1000);
        let later = t0 + Duration::from_millis(1500);
        assert!(matches!(c.gate(3, later), Gate::Close(_)), "expired");
        assert_eq!(c.gate(17, later), Gate::Sasl, "a re-authentication");
        assert_eq!(c.handshake(&settings(1000), 1, "PLAIN").error_code, 0);
        let a = c.authenticate(
            &settings(1000),
            2,
            b"\0alice\0alice-secret",
            &store(),
            later,
        );
        assert_eq!(a.error_code, 0);
        assert!(matches!(
            a.outcome,
            Some(AuthOutcome::Authenticated {
                reauthentication: true,
                ..
            })
        ));
        assert_eq!(c.gate(3, later), Gate::Serve);
        // A second re-authentication within a second is not one (Kafka
        // answers the handshake ILLEGAL_SASL_STATE).
        assert_eq!(c.gate(17, later), Gate::Sasl);
        assert_eq!(
            c.handshake(&settings(1000), 1, "PLAIN").error_code,
            ILLEGAL_SASL_STATE
        );
    }

    proptest::proptest! {
        // PLAIN salts each password (4096 HMACs, slow in a debug build).
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// Whatever a client sends, the state machine answers or closes;
        /// it never panics (bytes from the network).
        #[test]
        fn arbitrary_tokens_never_panic(
            mechanism in 0usize..3,
            first in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
            second in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
        ) {
            let now = Instant::now();
            let name = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"][mechanism];
            let mut c = SaslConnection::new();
            let mut all = settings(0);
            all.mechanisms.push(Mechanism::Scram(ScramMechanism::Sha512));
            c.handshake(&all, 1, name);
            let a = c.authenticate(&all, 2, &first, &store(), now);
            if a.error_code == 0 && !c.authenticated() {
                c.authenticate(&all, 2, &second, &store(), now);
            }
            // A first message that parses gets the real SCRAM user's
            // challenge; then an arbitrary final message.
            let mut c = SaslConnection::new();
            c.handshake(&all, 1, name);
            c.authenticate(&all, 2, b"n,,n=alice,r=abc", &store(), now);
            c.authenticate(&all, 2, &second, &store(), now);
        }
    }

    #[test]
    fn api_names_are_kafkas() {
        assert_eq!(api_name(3), "METADATA");
        assert_eq!(api_name(10), "FIND_COORDINATOR");
    }
}

//! SaslHandshake (17) and SaslAuthenticate (36): the wire side of
//! `auth::sasl`'s state machine.
//!
//! On a SASL listener the connection's reader sends these here in arrival
//! order, before reading the next request (see `net`), so the principal a
//! SaslAuthenticate sets applies to exactly the requests after it. On a
//! PLAINTEXT listener, and after authentication when no re-authentication
//! is due, they get Kafka's `KafkaApis` answers: ILLEGAL_SASL_STATE.
//!
//! Credentials come from the shard's metadata image (the SCRAM store, see
//! `auth::sasl::Credentials`). A PLAIN login salts the given password with
//! the stored salt and iterations (4096–16384 HMACs, milliseconds of CPU)
//! on the shard's blocking thread, not on the shard, whose other
//! connections would wait that long; the connection waits for it before
//! reading its next request, so the order of its requests is kept. SCRAM
//! logins cost a few hashes and run inline.

use super::{respond, str_bytes, Outcome};
use crate::auth::sasl::{AuthOutcome, Credentials, Mechanism, SaslSettings, ILLEGAL_SASL_STATE};
use crate::auth::scram::ScramMechanism;
use crate::auth::{audit, Session};
use crate::protocol::RequestHeader;
use crate::record::RecordsChunk;
use crate::shard::ShardCtx;
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse,
};

/// What SASL listeners accept, from the broker config.
pub fn settings(ctx: &ShardCtx) -> SaslSettings {
    SaslSettings {
        mechanisms: ctx
            .config
            .sasl_mechanisms
            .iter()
            .filter_map(|m| crate::auth::sasl::Mechanism::from_name(m))
            .collect(),
        connections_max_reauth_ms: ctx.config.connections_max_reauth_ms,
    }
}

/// A SASL request on a connection without SASL state (a PLAINTEXT
/// listener): Kafka's `KafkaApis.handleSaslHandshakeRequest` /
/// `handleSaslAuthenticateRequest` answers.
pub fn on_plaintext(header: &RequestHeader, body: &mut BytesMut) -> Outcome {
    if header.api_key == ApiKey::SaslHandshake as i16 {
        if super::decode::<SaslHandshakeRequest>(header, body).is_none() {
            return Outcome::Close;
        }
        respond(
            header,
            &SaslHandshakeResponse::default().with_error_code(ILLEGAL_SASL_STATE),
        )
    } else {
        if super::decode::<SaslAuthenticateRequest>(header, body).is_none() {
            return Outcome::Close;
        }
        respond(
            header,
            &SaslAuthenticateResponse::default()
                .with_error_code(ILLEGAL_SASL_STATE)
                .with_error_message(Some(str_bytes(
                    "SaslAuthenticate request received after successful authentication",
                ))),
        )
    }
}

/// A SaslHandshake or SaslAuthenticate on a SASL listener (the gate said
/// `Sasl`). An answer that ends the connection is written, then it closes.
/// The connection awaits this before reading its next request.
pub async fn handle(
    ctx: &ShardCtx,
    session: &Session,
    header: &RequestHeader,
    body: &mut BytesMut,
) -> (Outcome, bool) {
    let Some(sasl) = &session.sasl else {
        return (on_plaintext(header, body), false);
    };
    let settings = settings(ctx);
    if header.api_key == ApiKey::SaslHandshake as i16 {
        let Some(req) = super::decode::<SaslHandshakeRequest>(header, body) else {
            return (Outcome::Close, true);
        };
        let answer = sasl
            .borrow_mut()
            .handshake(&settings, header.api_version, &req.mechanism);
        if answer.close {
            audit::failed(
                session.peer,
                None,
                &req.mechanism,
                "unsupported SASL mechanism",
            );
        }
        let response = SaslHandshakeResponse::default()
            .with_error_code(answer.error_code)
            .with_mechanisms(answer.mechanisms.into_iter().map(str_bytes).collect());
        return (respond(header, &response), answer.close);
    }
    let Some(req) = super::decode::<SaslAuthenticateRequest>(header, body) else {
        return (Outcome::Close, true);
    };
    let plain = plain_verdict(ctx, session, &req.auth_bytes).await;
    let (answer, close) = authenticate(
        ctx,
        session,
        &settings,
        header.api_version,
        &req.auth_bytes,
        plain,
    );
    let response = SaslAuthenticateResponse::default()
        .with_error_code(answer.0)
        .with_error_message(answer.1.map(str_bytes))
        .with_auth_bytes(Bytes::from(answer.2))
        .with_session_lifetime_ms(answer.3);
    (respond(header, &response), close)
}

/// A bare SASL token (after SaslHandshake v0): answered with a bare
/// token; a failure closes without an answer, as Kafka does for v0.
pub async fn handle_raw_token(ctx: &ShardCtx, session: &Session, token: &[u8]) -> (Outcome, bool) {
    let settings = settings(ctx);
    let plain = plain_verdict(ctx, session, token).await;
    let ((code, _, bytes, _), close) = authenticate(ctx, session, &settings, 0, token, plain);
    if code != 0 || close {
        return (Outcome::Close, true);
    }
    let mut out = BytesMut::with_capacity(4 + bytes.len());
    out.extend_from_slice(&(bytes.len() as i32).to_be_bytes());
    out.extend_from_slice(&bytes);
    (
        Outcome::Reply(vec![RecordsChunk::Memory(out.freeze())]),
        false,
    )
}

type Answer = (i16, Option<String>, Vec<u8>, i64);

/// For a PLAIN token: whether its password is its user's, checked on the
/// shard's blocking thread (None: not a PLAIN exchange, or no such user).
async fn plain_verdict(ctx: &ShardCtx, session: &Session, token: &[u8]) -> Option<(String, bool)> {
    let sasl = session.sasl.as_ref()?;
    if sasl.borrow().authenticating_with() != Some(Mechanism::Plain) {
        return None;
    }
    let (user, password) = crate::auth::sasl::plain_user_and_password(token)?;
    let image = ctx.image();
    let (mechanism, credential) = ScramMechanism::ALL.into_iter().find_map(|m| {
        image
            .scram_credential(&user, m.type_id())
            .map(|c| (m, (**c).clone()))
    })?;
    let ok = glommio::executor()
        .spawn_blocking(move || mechanism.verify_password(&credential, &password))
        .await;
    Some((user, ok))
}

/// The image's credentials, with a PLAIN verdict made beforehand.
struct Checked<'a> {
    image: &'a crate::metadata::MetadataImage,
    plain: Option<(String, bool)>,
}

impl Credentials for Checked<'_> {
    fn scram(
        &self,
        user: &str,
        mechanism: ScramMechanism,
    ) -> Option<crate::metadata::ScramCredential> {
        self.image
            .scram_credential(user, mechanism.type_id())
            .map(|c| (**c).clone())
    }

    fn plain(&self, user: &str, _password: &str) -> bool {
        // Only the verdict made off the shard counts: an unknown user (no
        // verdict) fails.
        matches!(&self.plain, Some((u, true)) if u == user)
    }
}

fn authenticate(
    ctx: &ShardCtx,
    session: &Session,
    settings: &SaslSettings,
    version: i16,
    token: &[u8],
    plain: Option<(String, bool)>,
) -> (Answer, bool) {
    let Some(sasl) = &session.sasl else {
        return ((ILLEGAL_SASL_STATE, None, Vec::new(), 0), false);
    };
    let image = ctx.image();
    let credentials = Checked {
        image: &image,
        plain,
    };
    let answer = sasl.borrow_mut().authenticate(
        settings,
        version,
        token,
        &credentials,
        crate::clock::monotonic(),
    );
    match &answer.outcome {
        Some(AuthOutcome::Authenticated {
            principal,
            mechanism,
            reauthentication,
        }) => {
            session.set_principal(principal.clone());
            audit::authenticated(session.peer, principal, mechanism, *reauthentication);
        }
        Some(AuthOutcome::Failed {
            user,
            mechanism,
            reason,
        }) => audit::failed(session.peer, user.as_deref(), mechanism, reason),
        None => {}
    }
    (
        (
            answer.error_code,
            answer.error_message,
            answer.auth_bytes,
            answer.session_lifetime_ms,
        ),
        answer.close,
    )
}

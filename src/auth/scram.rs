//! SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka speaks
//! them: the credential a server stores, and the server side of one
//! exchange.
//!
//! What is stored is Kafka's `ScramCredential`: salt, StoredKey =
//! H(HMAC(SaltedPassword, "Client Key")), ServerKey =
//! HMAC(SaltedPassword, "Server Key") and the iteration count. Neither key
//! lets anyone log in: a client proves it knows ClientKey (whose hash is
//! StoredKey), and the server proves it knows ServerKey. The password is
//! never stored, and the salted password only lives while a credential is
//! made (`fjord scram add`, or by the Java admin client, which salts
//! client-side: AlterUserScramCredentials carries the salted password, not
//! the password).
//!
//! An exchange is two client messages ([`ScramServer`]): client-first
//! (user name and client nonce; answered with the server nonce, salt and
//! iterations) and client-final (the proof; answered with the server
//! signature). Its state is bounded: the three messages of the
//! AuthMessage, each at most one SASL token (`SASL_SERVER_MAX_RECEIVE_BYTES`
//! in `auth::sasl`). Proofs are compared in constant time (`subtle`).
//!
//! Kafka's rules kept: iterations of at least 4096 (`ITERATIONS_MIN`, the
//! minimum of Kafka's `ScramMechanism`) and at most 16384 for a new
//! credential (`ITERATIONS_MAX`, Kafka's `ScramControlManager`); user names
//! in `saslname` form (`=2C` for `,`, `=3D` for `=`); delegation-token
//! authentication (`tokenauth=true`) is refused, as fjord has no tokens.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha512};
use subtle::ConstantTimeEq;

/// Kafka's `ScramMechanism.minIterations()` (4096 for both mechanisms).
pub const ITERATIONS_MIN: i32 = 4096;
/// Kafka's `ScramControlManager.MAX_ITERATIONS`: most iterations a new
/// credential may have (each PLAIN login against it costs that many HMACs).
pub const ITERATIONS_MAX: i32 = 16384;
/// Bytes of random salt in a credential made here (`fjord scram add`); the
/// Java admin client makes its own salts.
pub const SALT_BYTES: usize = 32;
/// Random bytes in the server's nonce part (base64-encoded on the wire).
const SERVER_NONCE_BYTES: usize = 24;

/// The two SCRAM mechanisms, with Kafka's type ids (`ScramMechanism.type()`,
/// what Describe/AlterUserScramCredentials carry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScramMechanism {
    Sha256,
    Sha512,
}

impl ScramMechanism {
    pub const ALL: [ScramMechanism; 2] = [ScramMechanism::Sha256, ScramMechanism::Sha512];

    /// The SASL mechanism name.
    pub fn name(self) -> &'static str {
        match self {
            ScramMechanism::Sha256 => "SCRAM-SHA-256",
            ScramMechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    /// Kafka's type id: 1 for SCRAM-SHA-256, 2 for SCRAM-SHA-512.
    pub fn type_id(self) -> i8 {
        match self {
            ScramMechanism::Sha256 => 1,
            ScramMechanism::Sha512 => 2,
        }
    }

    pub fn from_type_id(id: i8) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.type_id() == id)
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    fn hmac(self, key: &[u8], data: &[&[u8]]) -> Vec<u8> {
        fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], data: &[&[u8]]) -> Vec<u8> {
            let mut mac = <M as hmac::digest::KeyInit>::new_from_slice(key)
                .expect("HMAC takes keys of any length");
            for d in data {
                mac.update(d);
            }
            mac.finalize().into_bytes().to_vec()
        }
        match self {
            ScramMechanism::Sha256 => run::<Hmac<Sha256>>(key, data),
            ScramMechanism::Sha512 => run::<Hmac<Sha512>>(key, data),
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            ScramMechanism::Sha256 => Sha256::digest(data).to_vec(),
            ScramMechanism::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    /// Hi(password, salt, i) of RFC 5802: PBKDF2 with this HMAC.
    pub fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            ScramMechanism::Sha256 => {
                let mut out = [0u8; 32];
                pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out);
                out.to_vec()
            }
            ScramMechanism::Sha512 => {
                let mut out = [0u8; 64];
                pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out);
                out.to_vec()
            }
        }
    }

    /// The stored credential for a salted password (what Kafka's controller
    /// computes from an AlterUserScramCredentials upsertion).
    pub fn credential_from_salted(
        self,
        salted_password: &[u8],
        salt: Vec<u8>,
        iterations: i32,
    ) -> ScramCredential {
        let client_key = self.hmac(salted_password, &[b"Client Key"]);
        ScramCredential {
            salt,
            stored_key: self.hash(&client_key),
            server_key: self.hmac(salted_password, &[b"Server Key"]),
            iterations,
        }
    }

    /// A new credential for `password` with a fresh random salt.
    pub fn new_credential(self, password: &str, iterations: i32) -> ScramCredential {
        let salt: [u8; SALT_BYTES] = rand::random();
        let salted = self.salted_password(password.as_bytes(), &salt, iterations.max(1) as u32);
        self.credential_from_salted(&salted, salt.to_vec(), iterations)
    }

    /// Whether `password` is the one `credential` was made from (SASL/PLAIN
    /// checked against the SCRAM store): the salted password is recomputed
    /// with the stored salt and iterations, and its StoredKey compared in
    /// constant time. Costs `iterations` HMACs.
    pub fn verify_password(self, credential: &ScramCredential, password: &str) -> bool {
        let Ok(iterations) = u32::try_from(credential.iterations) else {
            return false;
        };
        if iterations == 0 {
            return false;
        }
        let salted = self.salted_password(password.as_bytes(), &credential.salt, iterations);
        let client_key = self.hmac(&salted, &[b"Client Key"]);
        let stored_key = self.hash(&client_key);
        bool::from(stored_key.ct_eq(&credential.stored_key))
    }
}

/// Kafka's `ScramCredential`: what the broker keeps of a SCRAM user's
/// password (in the metadata log, `MetadataRecord::UserScramCredential`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ScramCredential {
    pub salt: Vec<u8>,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
    pub iterations: i32,
}

/// Why a SCRAM exchange failed. `Credentials` is every failure that must
/// not tell the client more than "invalid credentials" (unknown user, wrong
/// proof: Kafka answers both with the same message); `Client` carries
/// Kafka's message for the client's own mistakes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScramError {
    /// Answered with Kafka's generic "invalid credentials" message.
    Credentials(&'static str),
    /// Answered with this message (Kafka's SaslAuthenticationException).
    Client(String),
}

/// Where an exchange is.
#[derive(Debug)]
enum Stage {
    /// Waiting for client-first.
    First,
    /// Sent server-first; waiting for client-final.
    Final {
        user: String,
        gs2_header: String,
        nonce: String,
        client_first_bare: String,
        server_first: String,
        credential: ScramCredential,
    },
    /// Succeeded or failed: no more messages are taken.
    Done,
}

/// The server side of one SCRAM exchange (one connection, one attempt).
#[derive(Debug)]
pub struct ScramServer {
    mechanism: ScramMechanism,
    stage: Stage,
}

/// What a step of the exchange produced.
#[derive(Debug, PartialEq, Eq)]
pub enum ScramStep {
    /// Send this challenge; the exchange goes on.
    Continue(Vec<u8>),
    /// Authenticated as this user; send the server-final message.
    Done { user: String, server_final: Vec<u8> },
}

impl ScramServer {
    pub fn new(mechanism: ScramMechanism) -> Self {
        Self {
            mechanism,
            stage: Stage::First,
        }
    }

    pub fn mechanism(&self) -> ScramMechanism {
        self.mechanism
    }

    /// Takes the next client message. `lookup` gives the stored credential
    /// of a user of this mechanism. After an error or `Done`, every further
    /// message is an error.
    pub fn step(
        &mut self,
        message: &[u8],
        lookup: impl FnOnce(&str) -> Option<ScramCredential>,
    ) -> Result<ScramStep, ScramError> {
        let stage = std::mem::replace(&mut self.stage, Stage::Done);
        match stage {
            Stage::First => {
                let (step, next) = self.first(message, lookup)?;
                self.stage = next;
                Ok(step)
            }
            Stage::Final {
                user,
                gs2_header,
                nonce,
                client_first_bare,
                server_first,
                credential,
            } => self.finish(
                message,
                user,
                &gs2_header,
                &nonce,
                &client_first_bare,
                &server_first,
                &credential,
            ),
            Stage::Done => Err(ScramError::Client(
                "Unexpected message after the SCRAM exchange ended".into(),
            )),
        }
    }

    fn first(
        &self,
        message: &[u8],
        lookup: impl FnOnce(&str) -> Option<ScramCredential>,
    ) -> Result<(ScramStep, Stage), ScramError> {
        let text = std::str::from_utf8(message)
            .map_err(|_| ScramError::Credentials("client-first is not UTF-8"))?;
        // gs2-header: cbind-flag "," [authzid] ","
        let mut parts = text.splitn(3, ',');
        let cbind = parts.next().unwrap_or("");
        let authzid_raw = parts.next();
        let bare = parts.next();
        let (Some(authzid_raw), Some(bare)) = (authzid_raw, bare) else {
            return Err(ScramError::Credentials("malformed client-first"));
        };
        if cbind != "n" && cbind != "y" {
            // "p=...": channel binding, which Kafka's SCRAM does not offer.
            return Err(ScramError::Credentials("channel binding is not supported"));
        }
        let authzid = match authzid_raw {
            "" => None,
            a => match a.strip_prefix("a=") {
                Some(name) => Some(
                    decode_saslname(name).ok_or(ScramError::Credentials("malformed authzid"))?,
                ),
                None => return Err(ScramError::Credentials("malformed gs2 header")),
            },
        };
        let gs2_header = format!("{cbind},{authzid_raw},");
        let mut fields = bare.split(',');
        let user = fields
            .next()
            .and_then(|f| f.strip_prefix("n="))
            .and_then(decode_saslname)
            .ok_or(ScramError::Credentials("malformed user name"))?;
        let client_nonce = fields
            .next()
            .and_then(|f| f.strip_prefix("r="))
            .filter(|n| !n.is_empty())
            .ok_or(ScramError::Credentials("malformed client nonce"))?;
        for ext in fields {
            if ext == "tokenauth=true" {
                return Err(ScramError::Credentials(
                    "delegation tokens are not supported",
                ));
            }
        }
        if authzid.as_deref().is_some_and(|a| a != user) {
            return Err(ScramError::Client(
                "Authentication failed: Client requested an authorization id that is different from username".into(),
            ));
        }
        let credential = lookup(&user).ok_or(ScramError::Credentials("unknown user"))?;
        if credential.iterations < ITERATIONS_MIN {
            return Err(ScramError::Credentials("too few iterations"));
        }
        let server_nonce: [u8; SERVER_NONCE_BYTES] = rand::random();
        let nonce = format!("{client_nonce}{}", B64.encode(server_nonce));
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&credential.salt),
            credential.iterations
        );
        let step = ScramStep::Continue(server_first.clone().into_bytes());
        Ok((
            step,
            Stage::Final {
                user,
                gs2_header,
                nonce,
                client_first_bare: bare.to_string(),
                server_first,
                credential,
            },
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        message: &[u8],
        user: String,
        gs2_header: &str,
        nonce: &str,
        client_first_bare: &str,
        server_first: &str,
        credential: &ScramCredential,
    ) -> Result<ScramStep, ScramError> {
        let text = std::str::from_utf8(message)
            .map_err(|_| ScramError::Credentials("client-final is not UTF-8"))?;
        let (without_proof, proof) = text
            .rsplit_once(",p=")
            .ok_or(ScramError::Credentials("client-final has no proof"))?;
        let mut fields = without_proof.split(',');
        let binding = fields
            .next()
            .and_then(|f| f.strip_prefix("c="))
            .ok_or(ScramError::Credentials("malformed channel binding"))?;
        let final_nonce = fields
            .next()
            .and_then(|f| f.strip_prefix("r="))
            .ok_or(ScramError::Credentials("malformed nonce"))?;
        if B64.decode(binding).ok().as_deref() != Some(gs2_header.as_bytes()) {
            return Err(ScramError::Credentials("channel binding mismatch"));
        }
        if final_nonce != nonce {
            return Err(ScramError::Credentials(
                "Invalid client nonce in the final client message.",
            ));
        }
        let proof = B64
            .decode(proof)
            .map_err(|_| ScramError::Credentials("proof is not base64"))?;
        let auth_message = [
            client_first_bare.as_bytes(),
            b",",
            server_first.as_bytes(),
            b",",
            without_proof.as_bytes(),
        ];
        let m = self.mechanism;
        let client_signature = m.hmac(&credential.stored_key, &auth_message);
        if proof.len() != client_signature.len() {
            return Err(ScramError::Credentials("Invalid client credentials"));
        }
        let client_key: Vec<u8> = proof
            .iter()
            .zip(&client_signature)
            .map(|(a, b)| a ^ b)
            .collect();
        let computed = m.hash(&client_key);
        if !bool::from(computed.ct_eq(&credential.stored_key)) {
            return Err(ScramError::Credentials("Invalid client credentials"));
        }
        let server_signature = m.hmac(&credential.server_key, &auth_message);
        Ok(ScramStep::Done {
            user,
            server_final: format!("v={}", B64.encode(server_signature)).into_bytes(),
        })
    }
}

/// RFC 5802's saslname: `=2C` is `,`, `=3D` is `=`, any other `=` is
/// malformed.
pub fn decode_saslname(name: &str) -> Option<String> {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        let esc = rest.get(i..i + 3)?;
        match esc {
            "=2C" => out.push(','),
            "=3D" => out.push('='),
            _ => return None,
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client of RFC 5802, to drive the server in tests.
    fn client_final(
        m: ScramMechanism,
        password: &str,
        client_first_bare: &str,
        server_first: &str,
    ) -> (String, Vec<u8>) {
        let mut salt = None;
        let mut iterations = 0;
        let mut nonce = "";
        for f in server_first.split(',') {
            if let Some(s) = f.strip_prefix("s=") {
                salt = Some(B64.decode(s).unwrap());
            } else if let Some(i) = f.strip_prefix("i=") {
                iterations = i.parse().unwrap();
            } else if let Some(r) = f.strip_prefix("r=") {
                nonce = r;
            }
        }
        let salted = m.salted_password(password.as_bytes(), &salt.unwrap(), iterations);
        let client_key = m.hmac(&salted, &[b"Client Key"]);
        let stored_key = m.hash(&client_key);
        let without_proof = format!("c=biws,r={nonce}");
        let auth = format!("{client_first_bare},{server_first},{without_proof}");
        let sig = m.hmac(&stored_key, &[auth.as_bytes()]);
        let proof: Vec<u8> = client_key.iter().zip(&sig).map(|(a, b)| a ^ b).collect();
        let server_key = m.hmac(&salted, &[b"Server Key"]);
        let expected_server_final =
            format!("v={}", B64.encode(m.hmac(&server_key, &[auth.as_bytes()]))).into_bytes();
        (
            format!("{without_proof},p={}", B64.encode(proof)),
            expected_server_final,
        )
    }

    fn exchange(
        m: ScramMechanism,
        stored: &ScramCredential,
        password: &str,
    ) -> Result<ScramStep, ScramError> {
        let mut server = ScramServer::new(m);
        let bare = "n=alice,r=fyko+d2lbbFgONRv9qkxdawL";
        let first = format!("n,,{bare}");
        let ScramStep::Continue(server_first) =
            server.step(first.as_bytes(), |u| (u == "alice").then(|| stored.clone()))?
        else {
            panic!("first step must continue");
        };
        let server_first = String::from_utf8(server_first).unwrap();
        assert!(server_first.starts_with("r=fyko+d2lbbFgONRv9qkxdawL"));
        let (fin, expected) = client_final(m, password, bare, &server_first);
        let step = server.step(fin.as_bytes(), |_| None)?;
        if let ScramStep::Done { server_final, .. } = &step {
            assert_eq!(
                server_final, &expected,
                "the server proves it knows ServerKey"
            );
        }
        Ok(step)
    }

    #[test]
    fn both_mechanisms_accept_the_right_password_and_refuse_a_wrong_one() {
        for m in ScramMechanism::ALL {
            let stored = m.new_credential("alice-secret", ITERATIONS_MIN);
            let ok = exchange(m, &stored, "alice-secret").unwrap();
            assert!(matches!(ok, ScramStep::Done { ref user, .. } if user == "alice"));
            assert_eq!(
                exchange(m, &stored, "wrong").unwrap_err(),
                ScramError::Credentials("Invalid client credentials")
            );
            assert!(m.verify_password(&stored, "alice-secret"));
            assert!(!m.verify_password(&stored, "alice-secre"));
        }
    }

    #[test]
    fn rfc7677_test_vector_salted_password() {
        // RFC 7677 §3: user "user", password "pencil", salt
        // W22ZaJ0SNY7soEsUEjb6gQ==, 4096 iterations; the server signature
        // of its exchange follows from StoredKey/ServerKey.
        let m = ScramMechanism::Sha256;
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let salted = m.salted_password(b"pencil", &salt, 4096);
        let cred = m.credential_from_salted(&salted, salt, 4096);
        let bare = "n=user,r=rOprNGfwEbeRWgbNEkqO";
        let server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let without_proof = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
        let auth = format!("{bare},{server_first},{without_proof}");
        let sig = m.hmac(&cred.server_key, &[auth.as_bytes()]);
        assert_eq!(
            B64.encode(sig),
            "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
        let client_sig = m.hmac(&cred.stored_key, &[auth.as_bytes()]);
        let client_key = m.hmac(&salted, &[b"Client Key"]);
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&client_sig)
            .map(|(a, b)| a ^ b)
            .collect();
        assert_eq!(
            B64.encode(proof),
            "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
    }

    #[test]
    fn unknown_users_bad_messages_and_replays_fail() {
        let m = ScramMechanism::Sha256;
        let mut s = ScramServer::new(m);
        assert_eq!(
            s.step(b"n,,n=bob,r=abc", |_| None).unwrap_err(),
            ScramError::Credentials("unknown user")
        );
        assert!(
            s.step(b"n,,n=bob,r=abc", |_| None).is_err(),
            "done after a failure"
        );
        for bad in [
            &b""[..],
            b"n",
            b"n,,",
            b"p=tls-unique,,n=a,r=b",
            b"n,,n=a",
            b"\xff\xfe",
        ] {
            let mut s = ScramServer::new(m);
            assert!(
                s.step(bad, |_| Some(m.new_credential("x", 4096))).is_err(),
                "{bad:?}"
            );
        }
        let mut s = ScramServer::new(m);
        let e = s
            .step(b"n,a=mallory,n=alice,r=abc", |_| {
                Some(m.new_credential("x", 4096))
            })
            .unwrap_err();
        assert!(matches!(e, ScramError::Client(_)));
    }

    #[test]
    fn saslnames_decode_escapes() {
        assert_eq!(decode_saslname("a=2Cb=3Dc").as_deref(), Some("a,b=c"));
        assert_eq!(decode_saslname("plain").as_deref(), Some("plain"));
        assert_eq!(decode_saslname("a=2"), None);
        assert_eq!(decode_saslname("a=41"), None);
    }
}

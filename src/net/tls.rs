//! TLS for SSL and SASL_SSL listeners: rustls (ring provider; no OpenSSL),
//! driven over glommio's sockets by futures-rustls.
//!
//! - Settings: `--tls-cert` (PEM chain), `--tls-key` (PEM key: PKCS#8,
//!   RSA or SEC1), `--tls-client-ca` and `--tls-client-auth`
//!   (`config::TlsSettings`). [`TlsStore::load`] reads them at start-up and
//!   refuses to start on a missing or bad file, naming it.
//! - Reload: SIGHUP sets a flag (`server`, as SIGTERM sets the stop flag);
//!   a thread of the main process sees it, re-reads the files off the
//!   shards ([`TlsStore::reload`]) and publishes the new `ServerConfig`
//!   with a new generation. Each shard's accept loop compares the
//!   generation (one atomic load per accepted TLS connection) and takes the
//!   new config for the connections it accepts from then on; an open
//!   connection keeps the config it was accepted with. A reload that fails
//!   logs the error and keeps the old config.
//! - Handshake: bounded by [`TLS_HANDSHAKE_TIMEOUT`]. A plaintext Kafka
//!   client on a TLS port, garbage, an untrusted certificate or a timeout
//!   end that connection only and are logged through `auth::audit`
//!   (rate-limited).
//! - Memory: what one connection's TLS session holds is bounded by
//!   rustls's defaults, which fjord keeps: 16 KiB of decrypted bytes not
//!   yet read, 64 KiB each of plaintext and of records waiting to be sent,
//!   one incoming record (16 KiB and its header) being deframed, and
//!   handshake messages of at most 64 KiB. The connection limits
//!   (`--max-connections-per-shard`, the handshake bound) bound the rest.
//! - Principal: on SSL, a verified client certificate's subject as Kafka
//!   prints it (`auth::x500`), `User:CN=...`; no certificate:
//!   `User:ANONYMOUS`. On SASL_SSL the SASL exchange sets it, as on
//!   SASL_PLAINTEXT.

use crate::auth::{audit, x500, Principal};
use crate::config::{TlsClientAuth, TlsSettings};
use futures_lite::io::{AsyncRead, AsyncWrite};
use futures_rustls::server::TlsStream;
use futures_rustls::TlsAcceptor;
use glommio::net::TcpStream;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

/// Longest a TLS handshake may take from accept to its end; a client still
/// handshaking then is disconnected (a slow-loris holding a connection
/// without ever sending a request).
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS config of the process: the files it comes from and the config
/// built from them last, with a generation counting successful reloads.
pub struct TlsStore {
    settings: TlsSettings,
    current: RwLock<Arc<ServerConfig>>,
    generation: AtomicU64,
}

impl TlsStore {
    /// Reads the certificate, key and client CA; an error names the file.
    pub fn load(settings: TlsSettings) -> anyhow::Result<TlsStore> {
        let config = build(&settings)?;
        Ok(TlsStore {
            settings,
            current: RwLock::new(config),
            generation: AtomicU64::new(0),
        })
    }

    /// Re-reads the files; on success new connections get the new config.
    /// On failure the old one stays and the error is returned.
    pub fn reload(&self) -> anyhow::Result<()> {
        let config = build(&self.settings)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = config;
        self.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn current(&self) -> Arc<ServerConfig> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// One shard's view of the [`TlsStore`]: the config it accepts with, taken
/// again when the store's generation moves.
pub struct ShardTls {
    store: Arc<TlsStore>,
    cached: RefCell<(u64, TlsAcceptor)>,
}

impl ShardTls {
    pub fn new(store: Arc<TlsStore>) -> ShardTls {
        let cached = RefCell::new((store.generation(), TlsAcceptor::from(store.current())));
        ShardTls { store, cached }
    }

    /// The acceptor for a connection accepted now.
    fn acceptor(&self) -> TlsAcceptor {
        let generation = self.store.generation();
        let mut cached = self.cached.borrow_mut();
        if cached.0 != generation {
            *cached = (generation, TlsAcceptor::from(self.store.current()));
        }
        cached.1.clone()
    }

    /// Runs the server side of the handshake on `stream`, within
    /// [`TLS_HANDSHAKE_TIMEOUT`]. A failure is logged (audit) and returned.
    pub async fn handshake(
        &self,
        stream: TcpStream,
        peer: Option<SocketAddr>,
        listener: &str,
    ) -> io::Result<TlsStream<TlsSocket>> {
        let accept = self.acceptor().accept(TlsSocket::new(stream));
        let timeout = glommio::timer::sleep(TLS_HANDSHAKE_TIMEOUT);
        let result = match futures::future::select(accept, std::pin::pin!(timeout)).await {
            futures::future::Either::Left((result, _)) => result,
            futures::future::Either::Right(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no handshake within {TLS_HANDSHAKE_TIMEOUT:?}"),
            )),
        };
        if let Err(e) = &result {
            audit::tls_failed(peer, listener, &e.to_string());
        }
        result
    }
}

/// Ciphertext read from the socket at once, for the TLS session to take
/// from memory.
pub const TLS_SOCKET_READ_BYTES: usize = 64 * 1024;

/// The TCP socket under a TLS session, read in chunks of
/// [`TLS_SOCKET_READ_BYTES`]. rustls asks its transport for at most 4 KiB
/// at a time; straight on the socket that was one read operation per 4 KiB
/// of ciphertext, which cost the broker more CPU per gigabyte than
/// decrypting it (`tuning/results/security.md`). Through this buffer one
/// socket read serves sixteen of rustls's. Writes go to the socket as they
/// come: rustls already hands over whole records.
///
/// Memory: one buffer per TLS connection, allocated at accept (bounded by
/// `--max-connections-per-shard`).
pub struct TlsSocket {
    inner: TcpStream,
    buf: Box<[u8]>,
    /// `buf[start..end]` is read from the socket, not yet taken.
    start: usize,
    end: usize,
}

impl TlsSocket {
    pub fn new(inner: TcpStream) -> TlsSocket {
        TlsSocket {
            inner,
            buf: vec![0; TLS_SOCKET_READ_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }
}

impl AsyncRead for TlsSocket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.start == this.end {
            if out.len() >= this.buf.len() {
                return Pin::new(&mut this.inner).poll_read(cx, out);
            }
            let n = match Pin::new(&mut this.inner).poll_read(cx, &mut this.buf) {
                Poll::Ready(Ok(n)) => n,
                other => return other,
            };
            this.start = 0;
            this.end = n;
        }
        let n = out.len().min(this.end - this.start);
        out[..n].copy_from_slice(&this.buf[this.start..this.start + n]);
        this.start += n;
        Poll::Ready(Ok(n))
    }
}

impl AsyncWrite for TlsSocket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_close(cx)
    }
}

impl AsRawFd for TlsSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
}

/// The principal a verified client certificate gives on an SSL listener:
/// `User:` + its subject (Kafka's DEFAULT `ssl.principal.mapping.rules`);
/// None without a certificate (the connection stays `User:ANONYMOUS`).
pub fn client_principal(stream: &TlsStream<TlsSocket>) -> Option<Principal> {
    let cert = stream.get_ref().1.peer_certificates()?.first()?;
    x500::subject_name(cert).map(Principal::user)
}

/// A `ServerConfig` from the files of `settings`.
fn build(settings: &TlsSettings) -> anyhow::Result<Arc<ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = read_certs(&settings.cert, "--tls-cert")?;
    let key = read_key(&settings.key)?;
    let verifier = match (settings.client_auth, &settings.client_ca) {
        (TlsClientAuth::None, _) => WebPkiClientVerifier::no_client_auth(),
        (auth, Some(ca)) => {
            let mut roots = RootCertStore::empty();
            for cert in read_certs(ca, "--tls-client-ca")? {
                roots.add(cert).map_err(|e| {
                    anyhow::anyhow!(
                        "--tls-client-ca {}: a bad CA certificate: {e}",
                        ca.display()
                    )
                })?;
            }
            let builder =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
            let builder = match auth {
                TlsClientAuth::Requested => builder.allow_unauthenticated(),
                _ => builder,
            };
            builder
                .build()
                .map_err(|e| anyhow::anyhow!("--tls-client-ca {}: {e}", ca.display()))?
        }
        (_, None) => anyhow::bail!("--tls-client-auth required|requested needs --tls-client-ca"),
    };
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| anyhow::anyhow!("TLS: {e}"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| {
            anyhow::anyhow!(
                "--tls-cert {} and --tls-key {}: {e}",
                settings.cert.display(),
                settings.key.display()
            )
        })?;
    Ok(Arc::new(config))
}

fn read_certs(path: &Path, flag: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path)
        .map_err(|e| anyhow::anyhow!("{flag} {}: cannot read: {e}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("{flag} {}: bad PEM: {e}", path.display()))?;
    anyhow::ensure!(
        !certs.is_empty(),
        "{flag} {}: no certificate (expected PEM `BEGIN CERTIFICATE` blocks)",
        path.display()
    );
    Ok(certs)
}

fn read_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    let pem = std::fs::read(path)
        .map_err(|e| anyhow::anyhow!("--tls-key {}: cannot read: {e}", path.display()))?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        anyhow::anyhow!(
            "--tls-key {}: no usable private key (expected PEM PKCS#8, RSA or SEC1): {e}",
            path.display()
        )
    })
}

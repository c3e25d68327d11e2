//! Connections: accept, frame, dispatch, answer in order.
//!
//! Each shard accepts on its own port and serves every connection it accepts
//! to the end; nothing of a connection ever leaves its shard. A connection is
//! two tasks:
//! - the reader cuts frames out of the receive buffer (the frame body is a
//!   `BytesMut` split off that buffer, so produce records stay where they were
//!   received), parses the header and calls [`handlers::dispatch`]. Dispatch
//!   does a request's synchronous part at once — for Produce that includes
//!   assigning offsets — so pipelined requests take effect in arrival order.
//!   The rest (waiting for the write, a long poll) is spawned as a task.
//! - the writer awaits those tasks strictly in request order and writes each
//!   response, so responses go back in request order as Kafka guarantees.
//!
//! The queue between them is bounded (`inflight_requests_max`): a client that
//! pipelines faster than the shard answers stops being read (TCP back-pressure).
//!
//! Limits, each a flag of `serve` (README's table):
//! - `max_connections_per_shard`: a connection accepted over it is closed at
//!   once (Kafka's `max.connections`, counted per shard);
//! - `connections_max_idle_ms`: a connection that sends nothing that long is
//!   closed (Kafka's `connections.max.idle.ms`, 10 minutes);
//! - `queued_max_request_bytes` (per shard, Kafka's
//!   `queued.max.request.bytes`) and `connection_queued_max_request_bytes`:
//!   the bytes read from sockets and not yet answered. At either limit a
//!   reader stops reading its socket at the next frame boundary until
//!   answers release bytes (TCP back-pressure, no error); a request already
//!   arriving is read whole, so the bytes holding the limit always belong
//!   to requests that will be answered.
//!
//! What the tail cache keeps of a request is not counted here: a frame's
//! bytes count until its answer is written, while a batch appended from it
//! may stay in the cache, zero-copy, keeping the receive buffer's allocation
//! alive. The cache charges itself for that allocation and copies a batch
//! that is a small part of it (`log::cache`), so a shard holds at most
//! `queued_max_request_bytes` of requests plus `tail_cache_bytes` of cache.
//!
//! Framing errors (negative length, a frame over `socket.request.max.bytes`),
//! an unknown api key or an undecodable header close this connection only.
//!
//! Listeners: a shard accepts on one socket per listener (`config::Listener`);
//! a connection's `Session` knows its listener. On a SASL_PLAINTEXT
//! listener the reader asks the session's SASL state (`auth::sasl`) about
//! every request before dispatching it: before authentication only
//! ApiVersions and the SASL requests pass (anything else closes the
//! connection, as Kafka does), a frame may be at most
//! `sasl.server.max.receive.size`, and SaslHandshake / SaslAuthenticate are
//! answered at once, in order, so the principal they set applies to the
//! requests read after them and to no earlier one. An answer that ends the
//! authentication (a failure) is written, then the connection closes.
//! Transport: on PLAINTEXT and SASL_PLAINTEXT the TCP socket, read with
//! `recv` and written with `write`/`sendfile`. On SSL and SASL_SSL a TLS
//! handshake ([`tls`], rustls) comes first, bounded by
//! `tls::TLS_HANDSHAKE_TIMEOUT` and counted against the connection limit;
//! then the same reader and writer run over the TLS stream: records are
//! decrypted into the same receive buffer (frames are still split off it
//! without a copy), responses are encrypted as written, and file ranges
//! are read into memory and encrypted (no sendfile through user-space
//! TLS). Reader and writer are generic over the [`Transport`], so the
//! plaintext path is compiled as before, with no per-read TLS branch.
//!
//! Kernel TLS (kTLS) would give the zero-copy paths back: after rustls's
//! handshake, `dangerous_extract_secrets()` yields the traffic keys and
//! sequence numbers; `setsockopt(TCP_ULP, "tls")` then `SOL_TLS`
//! `TLS_TX`/`TLS_RX` with them hands record encryption to the kernel, after
//! which `write`, `sendfile` and `recv` work on plaintext as on a TCP
//! socket (control records such as TLS 1.3 KeyUpdate or NewSessionTicket
//! arrive as `recvmsg` control messages and must be handled, and rustls
//! can no longer be used on the connection). It was not built: this
//! machine's kernel has `CONFIG_TLS` unset (`TCP_ULP` "tls" fails with
//! ENOENT), so it could be neither tried nor measured.
//!
//! Metrics: each request carries a `RequestStamp` (its API key, when the
//! read that completed its frame returned, when dispatch began) and its
//! task notes when its answer was ready; the writer records the request
//! into the shard's probe (`crate::metrics`) once its bytes are handed to
//! the socket. Three clock reads and a few cell updates per request, no
//! allocation; with `--metrics-recording false` no clock is read. Both
//! stages of a request are polled through `metrics::RequestTimed`, which
//! collects the time its handler spends in `metrics::remote_wait` (Kafka's
//! RemoteTimeMs, split out of the handler's time).

mod file_range;
pub mod metrics_http;
mod sendfile;
pub mod tls;

use crate::auth::sasl::Gate;
use crate::auth::{audit, Session};
use crate::handlers::{self, Outcome};
use crate::log::watch::OffsetWatch;
use crate::metrics::{self, ConnectionEvent};
use crate::protocol::frame::{declared_frame_len, FRAME_PREFIX_BYTES};
use crate::protocol::{parse_request_header, SOCKET_REQUEST_MAX_BYTES};
use crate::record::RecordsChunk;
use crate::shard::ShardCtx;
use bytes::{Buf, BytesMut};
use futures::FutureExt;
use futures_lite::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use futures_rustls::server::TlsStream;
use glommio::channels::local_channel;
use glommio::net::{TcpListener, TcpStream};
use glommio::task::JoinHandle;
use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// Bytes asked of the socket per read when no larger frame is pending.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// A read is never offered less room than this (the buffer grows first).
const READ_CHUNK_MIN_BYTES: usize = 4 * 1024;
/// The zeroed part of the room a read through glommio gets (it needs
/// initialized memory); the rest is filled by `recv_into_spare`.
const READ_WINDOW_BYTES: usize = 4 * 1024;
/// Room given at once to a pending frame; larger frames grow as they arrive.
const FRAME_ROOM_AT_ONCE_MAX_BYTES: usize = 4 << 20;
/// Longest a response write may wait for the client to make room.
const SOCKET_WRITE_STALL_MAX: std::time::Duration = std::time::Duration::from_secs(30);
/// The room a read through TLS gets at most: one TLS record's plaintext
/// (the zeroing is small beside decrypting it).
const TLS_READ_WINDOW_BYTES: usize = 16 * 1024;
/// Responses smaller than this are coalesced into one write.
const COALESCE_BYTES_MAX: usize = 64 * 1024;
/// At most one warning this often for connections refused at the limit.
const REFUSED_LOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// Binds a listening socket for one shard. Unlike glommio's `bind`, which
/// sets SO_REUSEPORT, this sets only SO_REUSEADDR (std's default): a restart
/// can bind while old connections linger in TIME_WAIT, but a second broker
/// cannot silently share the port and split its clients.
pub fn bind(addr: std::net::SocketAddr) -> io::Result<TcpListener> {
    let std_listener = std::net::TcpListener::bind(addr)?;
    std_listener.set_nonblocking(true)?;
    let fd = std_listener.into_raw_fd();
    // SAFETY: fd is a bound, listening TCP socket we own and hand over.
    Ok(unsafe { TcpListener::from_raw_fd(fd) })
}

thread_local! {
    /// The shard's connection bookkeeping, shared by all its listeners
    /// (each shard is one thread).
    static SHARD_NET: Rc<ShardNet> = Rc::new(ShardNet::default());
}

/// Accepts connections on listener `listener_index` of the config until the
/// task is dropped. A connection over the shard's
/// `max_connections_per_shard` (all listeners together) is closed at once
/// (Kafka's acceptor stops accepting at `max.connections`; closing tells
/// the client sooner than a full backlog would, and it retries with
/// back-off).
/// On an SSL or SASL_SSL listener each connection first completes a TLS
/// handshake with the shard's current TLS config (`tls`).
pub async fn accept_loop(
    ctx: Rc<ShardCtx>,
    listener_index: usize,
    listener: TcpListener,
    tls: Option<Rc<tls::ShardTls>>,
) {
    let net = SHARD_NET.with(|n| n.clone());
    let protocol = ctx.config.listener(listener_index).protocol;
    let tls = tls.filter(|_| protocol.is_tls());
    if protocol.is_tls() && tls.is_none() {
        tracing::error!(
            listener = protocol.name(),
            "TLS listener without a TLS config: not accepting"
        );
        return;
    }
    let mut refused_logged_at: Option<std::time::Instant> = None;
    loop {
        match listener.accept().await {
            Ok(stream) => {
                if net.connections.get() >= ctx.config.max_connections_per_shard {
                    net.refused.set(net.refused.get() + 1);
                    metrics::record_connection(ConnectionEvent::Refused);
                    let now = crate::clock::monotonic();
                    if refused_logged_at.is_none_or(|t| now - t >= REFUSED_LOG_INTERVAL) {
                        refused_logged_at = Some(now);
                        tracing::warn!(
                            peer = ?stream.peer_addr().ok(),
                            limit = ctx.config.max_connections_per_shard,
                            refused_total = net.refused.get(),
                            "connection refused: the shard serves its maximum of connections (--max-connections-per-shard)"
                        );
                    }
                    drop(stream);
                    continue;
                }
                metrics::record_connection(ConnectionEvent::Accepted);
                let ctx = ctx.clone();
                let net = net.clone();
                let tls = tls.clone();
                glommio::spawn_local(async move {
                    let peer = stream.peer_addr().ok();
                    let _open = OpenConnection::new(&net);
                    audit::accepted(peer, protocol.name());
                    let session = Session::on_listener(peer, listener_index, protocol.is_sasl());
                    let served = match (configure_socket(&ctx, &stream), tls) {
                        (Err(e), _) => Err(e),
                        (Ok(()), None) => serve_connection(ctx, net.clone(), session, stream).await,
                        (Ok(()), Some(tls)) => {
                            serve_tls(ctx, net.clone(), session, stream, &tls).await
                        }
                    };
                    if let Err(e) = served {
                        tracing::debug!(?peer, error = %e, "connection closed");
                    }
                })
                .detach();
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                glommio::timer::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    }
}

/// A shard's connection bookkeeping, shared by its accept loop and its
/// connections (shard-local).
#[derive(Default)]
struct ShardNet {
    /// Connections open now.
    connections: Cell<usize>,
    /// Connections refused at the limit since start.
    refused: Cell<u64>,
    /// Bytes read from this shard's sockets and not yet answered: requests
    /// in flight, and what the readers hold of requests still arriving.
    queued_request_bytes: Cell<usize>,
    /// Counts releases of `queued_request_bytes`, for readers that wait.
    released: OffsetWatch,
}

impl ShardNet {
    fn hold(&self, bytes: usize) {
        self.queued_request_bytes
            .set(self.queued_request_bytes.get() + bytes);
    }

    fn release(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        debug_assert!(bytes <= self.queued_request_bytes.get());
        self.queued_request_bytes
            .set(self.queued_request_bytes.get().saturating_sub(bytes));
        self.released.advance(self.released.get() + 1);
    }
}

/// Counts one open connection while it lives.
struct OpenConnection(Rc<ShardNet>);

impl OpenConnection {
    fn new(net: &Rc<ShardNet>) -> Self {
        net.connections.set(net.connections.get() + 1);
        OpenConnection(net.clone())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.connections.set(self.0.connections.get() - 1);
        metrics::record_connection(ConnectionEvent::Closed);
    }
}

/// The bytes one connection holds (read, not yet answered); given back to
/// the shard's count as answers are written, and wholly when it ends.
struct HeldBytes {
    net: Rc<ShardNet>,
    held: Cell<usize>,
}

impl HeldBytes {
    fn hold(&self, bytes: usize) {
        self.held.set(self.held.get() + bytes);
        self.net.hold(bytes);
    }

    fn release(&self, bytes: usize) {
        let bytes = bytes.min(self.held.get());
        self.held.set(self.held.get() - bytes);
        self.net.release(bytes);
    }
}

impl Drop for HeldBytes {
    fn drop(&mut self) {
        self.net.release(self.held.get());
    }
}

/// What a connection's reader and writer run over: the TCP socket itself
/// (PLAINTEXT, SASL_PLAINTEXT) or TLS over it (SSL, SASL_SSL). The code
/// below is generic over it, so each protocol gets its own copy and the
/// plaintext one has no TLS branch at all.
trait Transport: AsyncRead + AsyncWrite + AsRawFd + Unpin + 'static {
    /// The socket carries the Kafka protocol's bytes as they are: the
    /// reader may `recv` from the descriptor directly, the writer may
    /// `sendfile`, and a write needs no flush. Through TLS, the bytes are
    /// decrypted into the receive buffer and encrypted from the responses
    /// (file ranges are read into memory first), and written data may wait
    /// in the TLS session until flushed.
    const RAW: bool;
}

impl Transport for TcpStream {
    const RAW: bool = true;
}

impl Transport for TlsStream<tls::TlsSocket> {
    const RAW: bool = false;
}

/// A connection's stream shared by its reader and writer tasks. Both run on
/// the same thread and never poll at the same time, so a `RefCell` borrowed
/// only inside `poll_*` is enough.
struct SharedStream<S>(Rc<RefCell<S>>);

impl<S> Clone for SharedStream<S> {
    fn clone(&self) -> Self {
        SharedStream(self.0.clone())
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for SharedStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for SharedStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_flush(cx)
    }
    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_close(cx)
    }
}

/// A connection of a TLS listener: the handshake, then the same service as
/// plaintext over the TLS stream. On SSL the client certificate, if any,
/// names the principal; on SASL_SSL the SASL exchange does.
async fn serve_tls(
    ctx: Rc<ShardCtx>,
    net: Rc<ShardNet>,
    session: Rc<Session>,
    stream: TcpStream,
    tls: &tls::ShardTls,
) -> io::Result<()> {
    let protocol = ctx.config.listener(session.listener).protocol;
    let stream = tls.handshake(stream, session.peer, protocol.name()).await?;
    if !protocol.is_sasl() {
        if let Some(principal) = tls::client_principal(&stream) {
            audit::authenticated(session.peer, &principal, "SSL", false);
            session.set_principal(principal);
        }
    }
    serve_connection(ctx, net, session, stream).await
}

/// The socket options of every connection, set before a TLS handshake so
/// that the idle and write-stall limits bound it too.
fn configure_socket(ctx: &ShardCtx, stream: &TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    // A client that leaves a response unread this long loses the
    // connection, so it cannot pin the response's segment file and read
    // buffers for ever.
    stream.set_write_timeout(Some(SOCKET_WRITE_STALL_MAX))?;
    // Kafka's `connections.max.idle.ms`: a connection that sends nothing
    // for this long is closed (its read times out).
    stream.set_read_timeout(Some(std::time::Duration::from_millis(
        ctx.config.connections_max_idle_ms,
    )))?;
    Ok(())
}

async fn serve_connection<S: Transport>(
    ctx: Rc<ShardCtx>,
    net: Rc<ShardNet>,
    session: Rc<Session>,
    stream: S,
) -> io::Result<()> {
    let fd = stream.as_raw_fd();
    let stream = SharedStream(Rc::new(RefCell::new(stream)));
    let (tx, rx) = local_channel::new_bounded::<Dispatch>(ctx.config.inflight_requests_max);
    let queued = Rc::new(Cell::new(0usize));
    let held = Rc::new(HeldBytes {
        net,
        held: Cell::new(0),
    });
    let writer = glommio::spawn_local(write_responses(
        ctx.clone(),
        stream.clone(),
        fd,
        rx,
        queued.clone(),
        held.clone(),
    ));
    let read_result = read_requests(&ctx, &session, stream.clone(), fd, tx, queued, &held).await;
    // The sender is gone: the writer answers what was dispatched, then ends.
    let write_result = writer.await;
    read_result.and(write_result)
}

/// A dispatched request: the task that answers it (with the time its
/// answer was ready, when recording, and its remote time), the bytes of its
/// frame, and what the request's metrics need.
type Dispatch = (
    JoinHandle<(Outcome, Option<Instant>, Duration)>,
    usize,
    RequestStamp,
);

/// A request's API key and when it was read and dispatched (None when
/// metrics recording is off): see `metrics::ApiProbe` for the split.
#[derive(Clone, Copy)]
struct RequestStamp {
    api_key: i16,
    read_at: Option<Instant>,
    dispatched_at: Option<Instant>,
}

/// Now, if this shard records metrics (one clock read less per stamp when
/// it does not).
fn stamp() -> Option<Instant> {
    metrics::recording().then(crate::clock::monotonic)
}

/// Waits, at a frame boundary, while the shard holds
/// `queued_max_request_bytes` of requests or this connection holds
/// `connection_queued_max_request_bytes` with at least one request in
/// flight (Kafka mutes a channel the same way when its request memory pool
/// is exhausted). A request already arriving is read to its end, so the
/// bytes that hold the limit are always those of requests that will be
/// answered and released.
async fn admit(ctx: &ShardCtx, held: &HeldBytes, queued: &Cell<usize>) {
    let net = &held.net;
    loop {
        let shard_full = net.queued_request_bytes.get() >= ctx.config.queued_max_request_bytes;
        let conn_full =
            queued.get() > 0 && held.held.get() >= ctx.config.connection_queued_max_request_bytes;
        if !shard_full && !conn_full {
            return;
        }
        let seen = net.released.get();
        net.released.wait_above(seen, || false).await;
    }
}

async fn read_requests<S: Transport>(
    ctx: &Rc<ShardCtx>,
    session: &Rc<Session>,
    mut stream: SharedStream<S>,
    fd: i32,
    tx: local_channel::LocalSender<Dispatch>,
    queued: Rc<Cell<usize>>,
    held: &HeldBytes,
) -> io::Result<()> {
    // The socket is read straight into `buf` (all of it received bytes; its
    // spare capacity is room for the next read). A frame is split off the
    // front once whole, so a request body is never copied in user space
    // (the kernel's copy out of the socket is the only one).
    let mut buf = BytesMut::new();
    // The size of `buf`'s allocation, which every frame cut from it shares:
    // a batch the tail cache keeps zero-copy keeps all of it alive, so the
    // produce handler is told (see `log::cache`).
    let mut buf_alloc_bytes = 0usize;
    // The last read filled all it was offered: the socket likely holds more.
    let mut more_queued = false;
    // When the last bytes arrived (the frames cut now were complete then).
    let mut read_at = stamp();
    loop {
        // Cut every complete frame out of the buffer.
        let mut frame_total = None;
        loop {
            // Before authentication a frame is at most Kafka's
            // `sasl.server.max.receive.size`.
            let frame_max = match &session.sasl {
                Some(sasl) => sasl.borrow().frame_max_bytes(SOCKET_REQUEST_MAX_BYTES),
                None => SOCKET_REQUEST_MAX_BYTES,
            };
            let declared = declared_frame_len(&buf, frame_max)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            let Some(len) = declared else { break };
            let total = FRAME_PREFIX_BYTES + len;
            if buf.len() < total {
                frame_total = Some(total);
                break;
            }
            let mut frame = buf.split_to(total);
            frame.advance(FRAME_PREFIX_BYTES);
            if let Some(sasl) = &session.sasl {
                if sasl.borrow().expects_raw_token() {
                    // After SaslHandshake v0: a bare token, no header.
                    let (outcome, close) =
                        handlers::sasl::handle_raw_token(ctx, session, &frame).await;
                    let request = RequestStamp {
                        api_key: kafka_protocol::messages::ApiKey::SaslAuthenticate as i16,
                        read_at,
                        dispatched_at: stamp(),
                    };
                    queued.set(queued.get() + 1);
                    ctx.request_started();
                    if tx.send((answered(outcome), total, request)).await.is_err() || close {
                        return Ok(());
                    }
                    continue;
                }
            }
            let header = parse_request_header(&mut frame)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            let request = RequestStamp {
                api_key: header.api_key,
                read_at,
                dispatched_at: stamp(),
            };
            if let Some(sasl) = &session.sasl {
                let gate = sasl
                    .borrow_mut()
                    .gate(header.api_key, crate::clock::monotonic());
                match gate {
                    Gate::Serve => {}
                    Gate::Close(reason) => {
                        audit::refused(session.peer, &reason);
                        return Ok(());
                    }
                    Gate::Sasl => {
                        if !crate::protocol::supported(header.api_key, header.api_version) {
                            return Ok(());
                        }
                        let (outcome, close) =
                            handlers::sasl::handle(ctx, session, &header, &mut frame).await;
                        queued.set(queued.get() + 1);
                        ctx.request_started();
                        if tx.send((answered(outcome), total, request)).await.is_err() || close {
                            return Ok(());
                        }
                        continue;
                    }
                }
            }
            // Both stages are timed for their remote waits (see
            // `metrics::RequestTimed`): the ordered first stage here, the
            // answer in its task.
            let first_stage =
                std::pin::pin!(
                    handlers::dispatch(ctx, session, header, frame, buf_alloc_bytes).into_answer()
                );
            let (answer, first_remote) = metrics::RequestTimed::new(first_stage).await;
            let task = glommio::spawn_local(async move {
                let (outcome, remote) = metrics::RequestTimed::new(answer).await;
                (outcome, request.read_at.and(stamp()), first_remote + remote)
            })
            .detach();
            queued.set(queued.get() + 1);
            ctx.request_started();
            if tx.send((task, total, request)).await.is_err() {
                return Ok(()); // the writer is gone (write error or close)
            }
        }
        // Grow only when the room left is too small: room for the rest of a
        // pending frame at once (not in 64 KiB steps), else for a read chunk.
        // (Growing while earlier frames still share the buffer allocates a
        // new one, and every frame keeps its block alive in the tail cache:
        // growing on every read would pin a block per request.)
        // A large declared frame gets its room as its bytes arrive (doubling
        // from FRAME_ROOM_AT_ONCE_MAX_BYTES), so a 4-byte length prefix alone
        // cannot make the broker allocate up to socket.request.max.bytes.
        let filled = buf.len();
        let (need, grow_to) = match frame_total {
            Some(total) => {
                let step = (filled * 2).max(filled + FRAME_ROOM_AT_ONCE_MAX_BYTES);
                let need = total.min(step).max(filled + READ_CHUNK_MIN_BYTES);
                (need, need)
            }
            None => (filled + READ_CHUNK_MIN_BYTES, filled + READ_CHUNK_BYTES),
        };
        if buf.capacity() < need {
            // A buffer of its own for the received part of the next frame:
            // `reserve` could realloc, which copies all the old capacity.
            let mut grown = BytesMut::with_capacity(grow_to);
            grown.extend_from_slice(&buf);
            buf = grown;
            buf_alloc_bytes = buf.capacity();
        }
        // With no frame pending, read only a window's worth first: once its
        // length prefix is in, the frame gets room for all of it above
        // (moving at most a window), instead of the rest of a 64 KiB read
        // being moved to a larger buffer.
        let room = buf.capacity() - filled;
        let limit = match frame_total {
            Some(_) => room,
            None => READ_WINDOW_BYTES.min(room),
        };
        if frame_total.is_none() {
            admit(ctx, held, &queued).await;
        }
        if S::RAW && more_queued {
            let n = recv_into_spare(fd, &mut buf, limit)?;
            held.hold(n);
            more_queued = n == limit;
            if n > 0 {
                read_at = stamp();
                continue;
            }
        }
        // Wait for data through glommio, into a small zeroed window: its
        // reads need initialized memory, and zeroing all the room (a whole
        // large frame) before every read cost as much CPU as the kernel's
        // copy. If the window fills, more is likely queued: the next reads
        // take it straight into the uninitialized room, without waiting.
        // (Through TLS every read goes through the session, into a window
        // of up to a record.)
        let window = if S::RAW {
            READ_WINDOW_BYTES
        } else {
            TLS_READ_WINDOW_BYTES
        }
        .min(limit);
        buf.resize(filled + window, 0);
        let n = stream.read(&mut buf[filled..]).await?;
        read_at = stamp();
        buf.truncate(filled + n);
        held.hold(n);
        if n == 0 {
            return Ok(());
        }
        more_queued = n == window;
    }
}

/// A task that yields an answer already made (the SASL requests, answered
/// in the reader so they take effect in order).
fn answered(outcome: Outcome) -> JoinHandle<(Outcome, Option<Instant>, Duration)> {
    let ready_at = stamp();
    glommio::spawn_local(async move { (outcome, ready_at, Duration::ZERO) }).detach()
}

/// Appends to `buf` what the socket `fd` holds now, up to `limit` bytes of
/// `buf`'s spare capacity, without waiting (`MSG_DONTWAIT`), and returns
/// how many: 0 if it holds nothing or has reached end of stream (the next
/// read through glommio sees that).
fn recv_into_spare(fd: i32, buf: &mut BytesMut, limit: usize) -> io::Result<usize> {
    let spare = buf.spare_capacity_mut();
    let len = spare.len().min(limit);
    if len == 0 {
        return Ok(0);
    }
    // SAFETY: the kernel writes at most `len` (<= spare length) bytes into
    // the spare capacity, which `buf` owns; no initialized data is read or
    // aliased.
    let n = unsafe {
        libc::recv(
            fd,
            spare.as_mut_ptr().cast::<libc::c_void>(),
            len,
            libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
            _ => Err(e),
        };
    }
    // SAFETY: the kernel initialized the first `n` (<= spare length) bytes
    // of the spare capacity.
    unsafe { buf.set_len(buf.len() + n as usize) };
    Ok(n as usize)
}

async fn write_responses<S: Transport>(
    ctx: Rc<ShardCtx>,
    mut stream: SharedStream<S>,
    fd: i32,
    rx: local_channel::LocalReceiver<Dispatch>,
    queued: Rc<Cell<usize>>,
    held: Rc<HeldBytes>,
) -> io::Result<()> {
    let result = write_loop(&ctx, &mut stream, fd, &rx, &queued, &held).await;
    // Requests dispatched but never answered (the connection broke) are done too.
    for _ in 0..queued.get() {
        ctx.request_finished();
    }
    // Whatever ended the writer, end the reader too: a shut-down socket makes
    // its pending read return 0.
    // SAFETY: fd is the connection's socket, still open (the stream is alive).
    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
    result
}

async fn write_loop<S: Transport>(
    ctx: &ShardCtx,
    stream: &mut SharedStream<S>,
    fd: i32,
    rx: &local_channel::LocalReceiver<Dispatch>,
    queued: &Cell<usize>,
    held: &HeldBytes,
) -> io::Result<()> {
    let mut out = BytesMut::with_capacity(COALESCE_BYTES_MAX);
    let mut next: Option<Dispatch> = None;
    loop {
        // The next request in order: one already taken off the queue, or
        // wait for one — after writing what is buffered, so a response is
        // never held back while nothing else is ready.
        let (mut task, frame_bytes, request) = match next.take() {
            Some(t) => t,
            None => {
                flush(stream, &mut out).await?;
                match rx.recv().await {
                    Some(t) => t,
                    None => return Ok(()),
                }
            }
        };
        // Counted as queued until its answer is taken (see write_responses).
        queued.set(queued.get() - 1);
        // Its answer: at once if ready, else after writing the buffer.
        let outcome = match futures::poll!(&mut task) {
            std::task::Poll::Ready(o) => o,
            std::task::Poll::Pending => {
                flush(stream, &mut out).await?;
                task.await
            }
        };
        ctx.request_finished();
        // The request's bytes count until its answer is handed to the
        // socket (a reply's records are the log's, not the request's).
        held.release(frame_bytes);
        let Some((outcome, ready_at, remote)) = outcome else {
            return Err(io::Error::other("request task was cancelled"));
        };
        let mut bytes_out = 0usize;
        let closed = matches!(outcome, Outcome::Close);
        match outcome {
            Outcome::Reply(parts) => {
                for part in parts {
                    bytes_out += part.len();
                    match part {
                        RecordsChunk::Memory(b) => write_bytes(stream, &mut out, &b).await?,
                        RecordsChunk::Loaded(r) => write_bytes(stream, &mut out, &r).await?,
                        RecordsChunk::File(range) => {
                            flush(stream, &mut out).await?;
                            match &range.buffered {
                                // `--catch-up-reads sendfile` (not through
                                // TLS: the bytes must be encrypted)
                                Some(file) if S::RAW => {
                                    sendfile::send_range(
                                        fd,
                                        file,
                                        range.position,
                                        range.len,
                                        SOCKET_WRITE_STALL_MAX,
                                    )
                                    .await?
                                }
                                _ => file_range::send_range(stream, &range).await?,
                            }
                        }
                    }
                }
            }
            Outcome::NoReply => {}
            Outcome::Close => {
                flush(stream, &mut out).await?;
            }
        }
        if let (Some(read), Some(dispatched), Some(ready)) =
            (request.read_at, request.dispatched_at, ready_at)
        {
            let sent = crate::clock::monotonic();
            metrics::record_request(
                request.api_key,
                frame_bytes,
                bytes_out,
                metrics::RequestTimes {
                    queue: dispatched.saturating_duration_since(read),
                    handle: ready.saturating_duration_since(dispatched),
                    remote,
                    send: sent.saturating_duration_since(ready),
                },
                closed,
            );
        }
        if closed {
            return Ok(());
        }
        // Coalesce with the next response only if its request is already
        // here; whether it is answered yet is decided above.
        if let Some(Some(t)) = rx.recv().now_or_never() {
            next = Some(t);
        }
        if out.len() >= COALESCE_BYTES_MAX {
            flush(stream, &mut out).await?;
        }
    }
}

/// Writes `bytes` after what `out` holds: into `out` if it stays within
/// `COALESCE_BYTES_MAX`, else after flushing it, straight from `bytes`.
async fn write_bytes<S: Transport>(
    stream: &mut SharedStream<S>,
    out: &mut BytesMut,
    bytes: &[u8],
) -> io::Result<()> {
    if out.len() + bytes.len() <= COALESCE_BYTES_MAX {
        out.extend_from_slice(bytes);
        return Ok(());
    }
    flush(stream, out).await?;
    stream.write_all(bytes).await
}

/// Writes what `out` holds; through TLS, also sends what the session
/// still holds encrypted.
async fn flush<S: Transport>(stream: &mut SharedStream<S>, out: &mut BytesMut) -> io::Result<()> {
    if !out.is_empty() {
        stream.write_all(out).await?;
        out.clear();
    }
    if !S::RAW {
        stream.flush().await?;
    }
    Ok(())
}

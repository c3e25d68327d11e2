//! The network between the metadata quorum's nodes: Raft messages over TCP
//! between the controller shards (shard 0) of the nodes, as
//! `docs/replication.md` §2 plans, and metadata writes forwarded to the
//! leader (below). The controller (`shard::controller`) starts it on a node
//! of a quorum of several voters.
//!
//! Why it looks like this:
//! - **Frames** are a u32 length and a message in fjord's own codec
//!   ([`super::codec`]), never raft-rs's protobuf decoder (module doc of
//!   the codec). A length over [`FRAME_BYTES_MAX`], a message that does
//!   not decode, or one whose `from` is not the peer that connected closes
//!   the connection: a hostile or broken peer costs at most one frame's
//!   buffer, and never a panic.
//! - **Who may talk**: a connection's first frame is a handshake naming
//!   the sender and the receiver; the receiver keeps it only if the sender
//!   is a member and the receiver is itself, within [`HANDSHAKE_TIMEOUT`].
//!   At most [`Inbound::CONNECTIONS_MAX`] inbound connections are open at
//!   once (a member reconnecting after a cut opens a new one while the old
//!   one is still being noticed as dead).
//! - **One outbound connection per peer**, fed by a bounded queue of
//!   [`QUEUE_MESSAGES`]: a message to a peer whose queue is full is dropped
//!   ([`Peers::send`] says so). Raft retransmits whatever matters (a leader
//!   re-sends appends from the follower's acknowledged index, heartbeats
//!   and elections repeat), so dropping is safe and keeps a dead peer from
//!   growing memory.
//! - **Reconnect with back-off**: a failed connect or write waits
//!   [`BACKOFF_MIN`], doubling to [`BACKOFF_MAX`], then tries again; a
//!   success resets it.
//! - Each side writes on its own outbound connection only; replies come
//!   back on the peer's outbound connection. Two one-way streams per pair
//!   of nodes keep the code free of who-dials-whom races.
//! - **Forwarding** (`docs/replication.md` §3.2): a metadata write at a
//!   node that does not lead goes to the leader's controller as a request
//!   and its answer on a connection of its own ([`forward`]), opened with
//!   the forwarding handshake ([`FORWARD_MAGIC`]) to the same listener.
//!   One connection per request keeps a lost answer from being mistaken
//!   for the next one's, and a broken connection from holding others
//!   back; metadata writes are rare enough that the connect costs nothing.
//!   Both payloads are opaque bytes here (the controller's JSON), at most
//!   [`FORWARD_BYTES_MAX`]; at most [`FORWARDS_IN_FLIGHT_MAX`] requests
//!   from one node are served at once (more are closed unanswered), and
//!   the sender waits for the answer until the request's deadline only.
//!   A frame over the limit, or a payload the handler refuses, closes that
//!   connection and nothing else.
//! - **Joining** (`docs/replication.md` §3.2): a node outside the
//!   membership (a learner starting) asks to be added on a connection of
//!   its own opened with the join handshake ([`JOIN_MAGIC`]), the only
//!   one a non-member may open: one request of at most
//!   [`JOIN_BYTES_MAX`], one answer ([`join`]). At most
//!   [`JOINS_IN_FLIGHT_MAX`] are served at once (more are closed
//!   unanswered). The membership the listener checks handshakes against
//!   is shared with the controller ([`Members`]), which adds a learner
//!   once its addition commits and takes it out once its removal does
//!   (its connection is then closed at its next frame, its handshakes
//!   refused again, and [`Peers::remove`] stops sending to it).

use super::codec;
use bytes::{BufMut, BytesMut};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::channels::local_channel::{self, LocalSender};
use glommio::net::{TcpListener, TcpStream};
use raft::eraftpb::Message;
use std::cell::Cell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

/// Largest frame accepted: a Raft append carries at most one entry over
/// raft-rs's `max_size_per_msg` (1 MiB), and an entry is at most
/// `store::ENTRY_BYTES_MAX` (32 MiB).
pub const FRAME_BYTES_MAX: usize = super::store::RECORD_BYTES_MAX;
/// Messages queued for one peer before new ones are dropped.
pub const QUEUE_MESSAGES: usize = 1024;
/// First wait after a failed connection to a peer.
pub const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest wait between two connection attempts.
pub const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How long a connect may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long an accepted connection may take to send its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// The handshake's first bytes (and its version).
const MAGIC: &[u8; 4] = b"FJQ0";
/// The handshake of a forwarding connection (one request, one answer).
const FORWARD_MAGIC: &[u8; 4] = b"FJF0";
/// The handshake of a join connection (one request, one answer; the only
/// connection a node outside the membership may open).
const JOIN_MAGIC: &[u8; 4] = b"FJJ0";
/// Largest join request or answer (a node's address and a few fields).
pub const JOIN_BYTES_MAX: usize = 4096;
/// Join requests served at once; more are closed unanswered.
pub const JOINS_IN_FLIGHT_MAX: usize = 4;
/// magic, from u64, to u64.
const HANDSHAKE_BYTES: usize = 4 + 8 + 8;
/// Largest forwarded request or answer: a metadata change must fit in a
/// metadata record anyway (`store::RECORD_BYTES_MAX`).
pub const FORWARD_BYTES_MAX: usize = super::store::RECORD_BYTES_MAX;
/// Forwarded requests one node may have in flight at its leader (the
/// forwarding node waits for a permit; the leader closes any beyond it).
pub const FORWARDS_IN_FLIGHT_MAX: usize = 8;

/// Why a connection was closed (logged; tests check it).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("connection closed")]
    Closed,
    #[error("a frame of {0} bytes is over the limit of {FRAME_BYTES_MAX}")]
    TooLarge(usize),
    #[error("bad handshake: {0}")]
    Handshake(String),
    #[error("undecodable message: {0}")]
    Undecodable(String),
    #[error("a message from node {got} on node {peer}'s connection")]
    Spoofed { peer: u64, got: u64 },
    #[error("i/o: {0}")]
    Io(String),
}

/// Writes `answer` as the one frame a join or forwarding connection gets
/// back, which then ends (`Closed`); one over `max` bytes is not sent.
async fn answer_once(stream: &mut TcpStream, answer: &[u8], max: usize) -> FrameError {
    if answer.len() > max {
        return FrameError::TooLarge(answer.len());
    }
    match stream.write_all(&frame(answer)).await {
        Ok(()) => FrameError::Closed,
        Err(e) => FrameError::Io(e.to_string()),
    }
}

/// Writes one frame (length, then `payload`).
fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn handshake(from: u64, to: u64) -> Vec<u8> {
    handshake_with(MAGIC, from, to)
}

fn handshake_with(magic: &[u8; 4], from: u64, to: u64) -> Vec<u8> {
    let mut b = BytesMut::with_capacity(HANDSHAKE_BYTES);
    b.put_slice(magic);
    b.put_u64(from);
    b.put_u64(to);
    frame(&b)
}

/// Reads one frame of at most `max` bytes.
async fn read_frame(stream: &mut TcpStream, max: usize) -> Result<Vec<u8>, FrameError> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            FrameError::Closed
        } else {
            FrameError::Io(e.to_string())
        }
    })?;
    let len = u32::from_be_bytes(len) as usize;
    if len > max {
        return Err(FrameError::TooLarge(len));
    }
    let mut buf = vec![0u8; len];
    stream
        .read_exact(&mut buf)
        .await
        .map_err(|e| FrameError::Io(e.to_string()))?;
    Ok(buf)
}

/// The outbound side: one task and one bounded queue per peer.
pub struct Peers {
    me: u64,
    /// Each peer's queue, and what keeps its sender task going: the task
    /// ends once it is dropped (also while it cannot connect).
    queues: HashMap<u64, (LocalSender<Message>, Rc<()>)>,
    dropped: Rc<Cell<u64>>,
}

impl Peers {
    /// Starts a sender task per peer (`(raft id, "host:port")`) on the
    /// current glommio executor. The tasks end when `self` is dropped.
    pub fn start(me: u64, peers: &[(u64, String)]) -> Peers {
        let mut out = Peers {
            me,
            queues: HashMap::new(),
            dropped: Rc::new(Cell::new(0)),
        };
        for (id, addr) in peers {
            out.add(*id, addr.clone());
        }
        out
    }

    /// Whether `id` has a sender task.
    pub fn has(&self, id: u64) -> bool {
        self.queues.contains_key(&id)
    }

    /// Starts the sender task of a peer that joined (a learner); nothing
    /// when it has one already or is this node.
    pub fn add(&mut self, id: u64, addr: String) {
        let me = self.me;
        if id == me || self.queues.contains_key(&id) {
            return;
        }
        let (tx, rx) = local_channel::new_bounded::<Message>(QUEUE_MESSAGES);
        let alive = Rc::new(());
        let running = Rc::downgrade(&alive);
        self.queues.insert(id, (tx, alive));
        glommio::spawn_local(async move {
            let mut backoff = BACKOFF_MIN;
            // A message taken off the queue whose write failed: sent
            // first on the next connection.
            let mut pending: Option<Message> = None;
            loop {
                if running.strong_count() == 0 {
                    return; // removed, or Peers dropped
                }
                let connected =
                    match TcpStream::connect_timeout(addr.as_str(), CONNECT_TIMEOUT).await {
                        Ok(mut s) => {
                            let _ = s.set_nodelay(true);
                            s.write_all(&handshake(me, id)).await.map(|()| s)
                        }
                        Err(e) => Err(std::io::Error::other(e.to_string())),
                    };
                let mut stream = match connected {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::debug!(peer = id, %addr, error = %e, "metadata quorum: cannot reach a peer");
                        glommio::timer::sleep(backoff).await;
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                        continue;
                    }
                };
                tracing::debug!(peer = id, %addr, "metadata quorum: connected to a peer");
                backoff = BACKOFF_MIN;
                loop {
                    let m = match pending.take() {
                        Some(m) => m,
                        None => match rx.recv().await {
                            Some(m) => m,
                            None => return, // Peers dropped
                        },
                    };
                    let bytes = frame(&codec::encode_message(&m));
                    if let Err(e) = stream.write_all(&bytes).await {
                        tracing::debug!(peer = id, error = %e, "metadata quorum: a peer's connection failed");
                        pending = Some(m);
                        break;
                    }
                }
                glommio::timer::sleep(backoff).await;
            }
        })
        .detach();
    }

    /// Stops the sender task of a peer that left (a removed learner):
    /// its queue is dropped, its connection closed (or its connecting
    /// given up) by the task. Nothing when it has none.
    pub fn remove(&mut self, id: u64) {
        self.queues.remove(&id);
    }

    /// Queues `m` for `m.to`; false when it was dropped (an unknown peer or
    /// a full queue; Raft retransmits).
    pub fn send(&self, m: Message) -> bool {
        let sent = self
            .queues
            .get(&m.to)
            .is_some_and(|(q, _)| q.try_send(m).is_ok());
        if !sent {
            self.dropped.set(self.dropped.get() + 1);
        }
        sent
    }

    /// Messages dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }
}

/// Answers one forwarded request from node `from` (a raft id): Some(the
/// answer), or None to close the connection (a payload it refuses).
pub type ForwardHandler =
    Rc<dyn Fn(u64, Vec<u8>) -> futures::future::LocalBoxFuture<'static, Option<Vec<u8>>>>;

/// The raft ids whose handshakes the listener takes, shared with the
/// controller (a learner is added once its addition commits).
pub type Members = Rc<std::cell::RefCell<std::collections::BTreeSet<u64>>>;

/// What an inbound connection hands its traffic to.
#[derive(Clone)]
pub struct Handlers {
    /// Raft messages.
    pub deliver: Rc<dyn Fn(Message)>,
    /// Forwarded requests (None: forwarding connections are refused).
    pub forward: Option<ForwardHandler>,
    /// Join requests, from any node (None: join connections are refused).
    pub join: Option<ForwardHandler>,
    /// Forwarded requests being served, per sending node.
    in_flight: Rc<std::cell::RefCell<HashMap<u64, usize>>>,
    /// Join requests being served.
    joins: Rc<Cell<usize>>,
}

impl Handlers {
    pub fn new(deliver: Rc<dyn Fn(Message)>, forward: Option<ForwardHandler>) -> Handlers {
        Handlers {
            deliver,
            forward,
            join: None,
            in_flight: Rc::default(),
            joins: Rc::default(),
        }
    }

    /// Serves join requests with `join`.
    pub fn with_join(mut self, join: ForwardHandler) -> Handlers {
        self.join = Some(join);
        self
    }
}

/// Why a forwarded request got no answer.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ForwardError {
    /// The request was not sent whole (no connection, a failed write): the
    /// leader did not get it.
    #[error("not sent: {0}")]
    NotSent(String),
    /// Sent, but no answer came (the deadline, a closed connection, a
    /// frame over the limit): it may have been made.
    #[error("sent, but no answer: {0}")]
    NoAnswer(String),
}

/// Sends one forwarded request to raft id `to` at `addr` and waits for its
/// answer until `deadline` (module doc). `payload` must be at most
/// [`FORWARD_BYTES_MAX`] (else NotSent).
pub async fn forward(
    me: u64,
    to: u64,
    addr: &str,
    payload: &[u8],
    deadline: std::time::Instant,
) -> Result<Vec<u8>, ForwardError> {
    exchange(
        FORWARD_MAGIC,
        FORWARD_BYTES_MAX,
        me,
        to,
        addr,
        payload,
        deadline,
    )
    .await
}

/// Sends one join request from raft id `me` (not yet a member) to raft id
/// `to` at `addr` and waits for its answer until `deadline` (module doc);
/// `payload` at most [`JOIN_BYTES_MAX`].
pub async fn join(
    me: u64,
    to: u64,
    addr: &str,
    payload: &[u8],
    deadline: std::time::Instant,
) -> Result<Vec<u8>, ForwardError> {
    exchange(JOIN_MAGIC, JOIN_BYTES_MAX, me, to, addr, payload, deadline).await
}

/// One request and its answer on a connection of their own.
async fn exchange(
    magic: &[u8; 4],
    max: usize,
    me: u64,
    to: u64,
    addr: &str,
    payload: &[u8],
    deadline: std::time::Instant,
) -> Result<Vec<u8>, ForwardError> {
    if payload.len() > max {
        return Err(ForwardError::NotSent(format!(
            "a request of {} bytes is over the limit of {max}",
            payload.len()
        )));
    }
    let left = |now: std::time::Instant| deadline.saturating_duration_since(now);
    let connect_for = left(crate::clock::monotonic()).min(CONNECT_TIMEOUT);
    if connect_for.is_zero() {
        return Err(ForwardError::NotSent("the deadline passed".into()));
    }
    let mut stream = TcpStream::connect_timeout(addr, connect_for)
        .await
        .map_err(|e| ForwardError::NotSent(format!("cannot connect to {addr}: {e}")))?;
    let _ = stream.set_nodelay(true);
    let request = [handshake_with(magic, me, to), frame(payload)].concat();
    let exchange = async {
        stream
            .write_all(&request)
            .await
            .map_err(|e| ForwardError::NotSent(format!("writing to {addr}: {e}")))?;
        read_frame(&mut stream, max)
            .await
            .map_err(|e| ForwardError::NoAnswer(e.to_string()))
    };
    futures_lite::future::or(exchange, async {
        glommio::timer::sleep(left(crate::clock::monotonic())).await;
        Err(ForwardError::NoAnswer(
            "no answer by the request's deadline".into(),
        ))
    })
    .await
}

/// The inbound side: accepts members' connections and hands each message
/// to `deliver`, each forwarded request to `forward`.
pub struct Inbound;

impl Inbound {
    /// Inbound connections open at once, at most: a Raft connection and
    /// [`FORWARDS_IN_FLIGHT_MAX`] forwarding ones from each of the most
    /// voters and learners, with room for reconnects and joins.
    pub const CONNECTIONS_MAX: usize =
        2 * (9 + super::LEARNERS_MAX) * (1 + FORWARDS_IN_FLIGHT_MAX) + JOINS_IN_FLIGHT_MAX;

    /// Accepts connections on `listener` until it fails; each connection
    /// runs as its own task. `members`: the raft ids that may connect (as
    /// they are when a connection's handshake arrives).
    pub async fn serve(listener: TcpListener, me: u64, members: Members, handlers: Handlers) {
        let open = Rc::new(Cell::new(0usize));
        loop {
            let stream = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "metadata quorum: accept failed");
                    glommio::timer::sleep(BACKOFF_MIN).await;
                    continue;
                }
            };
            if open.get() >= Self::CONNECTIONS_MAX {
                tracing::warn!(
                    max = Self::CONNECTIONS_MAX,
                    "metadata quorum: too many inbound connections; closing a new one"
                );
                drop(stream);
                continue;
            }
            open.set(open.get() + 1);
            let open = open.clone();
            let members = members.clone();
            let handlers = handlers.clone();
            glommio::spawn_local(async move {
                let peer = stream.peer_addr().ok();
                let why = Self::connection_of(stream, me, &members, &handlers).await;
                tracing::debug!(?peer, reason = %why, "metadata quorum: inbound connection closed");
                open.set(open.get() - 1);
            })
            .detach();
        }
    }

    /// Runs one inbound connection to its end; returns why it ended.
    pub async fn connection(
        stream: TcpStream,
        me: u64,
        members: &[u64],
        handlers: &Handlers,
    ) -> FrameError {
        let members: Members = Rc::new(std::cell::RefCell::new(members.iter().copied().collect()));
        Self::connection_of(stream, me, &members, handlers).await
    }

    async fn connection_of(
        mut stream: TcpStream,
        me: u64,
        members: &Members,
        handlers: &Handlers,
    ) -> FrameError {
        let hello = futures_lite::future::or(read_frame(&mut stream, HANDSHAKE_BYTES), async {
            glommio::timer::sleep(HANDSHAKE_TIMEOUT).await;
            Err(FrameError::Handshake("none within the timeout".into()))
        })
        .await;
        let hello = match hello {
            Ok(h) => h,
            Err(FrameError::TooLarge(n)) => {
                return FrameError::Handshake(format!("a first frame of {n} bytes"))
            }
            Err(e) => return e,
        };
        let forwarding = hello.len() == HANDSHAKE_BYTES && &hello[..4] == FORWARD_MAGIC;
        let joining = hello.len() == HANDSHAKE_BYTES && &hello[..4] == JOIN_MAGIC;
        if hello.len() != HANDSHAKE_BYTES || (&hello[..4] != MAGIC && !forwarding && !joining) {
            return FrameError::Handshake("not a fjord metadata quorum handshake".into());
        }
        let from = u64::from_be_bytes(hello[4..12].try_into().expect("8 bytes"));
        let to = u64::from_be_bytes(hello[12..20].try_into().expect("8 bytes"));
        if to != me {
            return FrameError::Handshake(format!("for node {to}, this is node {me}"));
        }
        if joining {
            if from == me || from == 0 {
                return FrameError::Handshake(format!("a join from node {from}"));
            }
            return Self::joined(stream, from, handlers).await;
        }
        if from == me || !members.borrow().contains(&from) {
            return FrameError::Handshake(format!("node {from} is not a member"));
        }
        if forwarding {
            return Self::forwarded(stream, from, handlers).await;
        }
        loop {
            let bytes = match read_frame(&mut stream, FRAME_BYTES_MAX).await {
                Ok(b) => b,
                Err(e) => return e,
            };
            let m = match codec::decode_message(&bytes) {
                Ok(m) => m,
                Err(e) => return FrameError::Undecodable(e.to_string()),
            };
            if m.from != from {
                return FrameError::Spoofed {
                    peer: from,
                    got: m.from,
                };
            }
            if !members.borrow().contains(&from) {
                // A learner removed while connected.
                return FrameError::Handshake(format!("node {from} is no longer a member"));
            }
            (handlers.deliver)(m);
        }
    }

    /// Serves a join connection from `from`: one request frame, answered
    /// by the join handler, then the connection ends.
    async fn joined(mut stream: TcpStream, from: u64, handlers: &Handlers) -> FrameError {
        let Some(join) = handlers.join.clone() else {
            return FrameError::Handshake("this node takes no join requests".into());
        };
        if handlers.joins.get() >= JOINS_IN_FLIGHT_MAX {
            return FrameError::Handshake(format!(
                "{JOINS_IN_FLIGHT_MAX} join requests in flight, the most allowed"
            ));
        }
        handlers.joins.set(handlers.joins.get() + 1);
        let why = async {
            let bytes =
                match futures_lite::future::or(read_frame(&mut stream, JOIN_BYTES_MAX), async {
                    glommio::timer::sleep(HANDSHAKE_TIMEOUT).await;
                    Err(FrameError::Handshake(
                        "no join request within the timeout".into(),
                    ))
                })
                .await
                {
                    Ok(b) => b,
                    Err(e) => return e,
                };
            let Some(answer) = join(from, bytes).await else {
                return FrameError::Undecodable("a join request was refused".into());
            };
            answer_once(&mut stream, &answer, JOIN_BYTES_MAX).await
        }
        .await;
        handlers.joins.set(handlers.joins.get() - 1);
        why
    }

    /// Serves a forwarding connection from `from`: one request frame,
    /// answered by the handler, then the connection ends (its slot among
    /// the node's [`FORWARDS_IN_FLIGHT_MAX`] is free once the answer is
    /// written, before the sender can start another).
    async fn forwarded(mut stream: TcpStream, from: u64, handlers: &Handlers) -> FrameError {
        let Some(forward) = handlers.forward.clone() else {
            return FrameError::Handshake("this node takes no forwarded requests".into());
        };
        let busy = *handlers.in_flight.borrow().get(&from).unwrap_or(&0);
        if busy >= FORWARDS_IN_FLIGHT_MAX {
            return FrameError::Handshake(format!(
                "node {from} has {busy} forwarded requests in flight, the most allowed"
            ));
        }
        *handlers.in_flight.borrow_mut().entry(from).or_default() += 1;
        let why = async {
            let bytes = match read_frame(&mut stream, FORWARD_BYTES_MAX).await {
                Ok(b) => b,
                Err(e) => return e,
            };
            let Some(answer) = forward(from, bytes).await else {
                return FrameError::Undecodable("a forwarded request was refused".into());
            };
            answer_once(&mut stream, &answer, FORWARD_BYTES_MAX).await
        }
        .await;
        let mut in_flight = handlers.in_flight.borrow_mut();
        if let Some(n) = in_flight.get_mut(&from) {
            *n -= 1;
            if *n == 0 {
                in_flight.remove(&from);
            }
        }
        why
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::eraftpb::{Entry, MessageType};
    use std::cell::RefCell;

    fn message(from: u64, to: u64, index: u64) -> Message {
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgAppend);
        m.from = from;
        m.to = to;
        m.index = index;
        m.term = 3;
        let e = Entry {
            index: index + 1,
            term: 3,
            data: bytes::Bytes::from(format!("entry {index}")),
            ..Default::default()
        };
        m.set_entries(vec![e].into());
        m
    }

    fn run<F: std::future::Future<Output = ()> + 'static>(f: impl FnOnce() -> F + Send + 'static) {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .spawn(f)
            .expect("executor")
            .join()
            .expect("test body");
    }

    async fn wait_until(mut f: impl FnMut() -> bool) {
        for _ in 0..500 {
            if f() {
                return;
            }
            glommio::timer::sleep(Duration::from_millis(10)).await;
        }
        panic!("condition not reached in 5 s");
    }

    /// Messages arrive in order and whole, also to a peer that starts
    /// listening only after the sender began (the sender reconnects).
    #[test]
    fn messages_reach_a_peer_that_comes_up_late() {
        run(|| async {
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let addr = format!("127.0.0.1:{port}");
            let peers = Peers::start(1, &[(1, "unused".into()), (2, addr.clone())]);
            for i in 0..5 {
                assert!(peers.send(message(1, 2, i)));
            }
            assert!(!peers.send(message(1, 9, 0)), "no such peer");
            glommio::timer::sleep(BACKOFF_MIN * 3).await;
            let got = Rc::new(RefCell::new(Vec::new()));
            let sink = got.clone();
            let listener = TcpListener::bind(addr.as_str()).unwrap();
            glommio::spawn_local(Inbound::serve(
                listener,
                2,
                Rc::new(RefCell::new([1, 2, 3].into_iter().collect())),
                Handlers::new(Rc::new(move |m: Message| sink.borrow_mut().push(m)), None),
            ))
            .detach();
            wait_until(|| got.borrow().len() == 5).await;
            for (i, m) in got.borrow().iter().enumerate() {
                assert_eq!(*m, message(1, 2, i as u64));
            }
        });
    }

    /// Hostile or broken peers: each connection is closed with the reason,
    /// and the listener goes on serving a good peer after them.
    #[test]
    fn bad_peers_are_disconnected_and_cannot_grow_memory() {
        run(|| async {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let got = Rc::new(RefCell::new(Vec::new()));
            let sink = got.clone();
            let deliver = Handlers::new(Rc::new(move |m: Message| sink.borrow_mut().push(m)), None);
            let cases: Vec<(Vec<u8>, FrameError)> = vec![
                (
                    frame(b"GET / HTTP/1.1\r\n\r\n"),
                    FrameError::Handshake("not a fjord metadata quorum handshake".into()),
                ),
                (
                    frame(&[0; 100]),
                    FrameError::Handshake("a first frame of 100 bytes".into()),
                ),
                (
                    handshake(7, 2),
                    FrameError::Handshake("node 7 is not a member".into()),
                ),
                (
                    handshake(1, 3),
                    FrameError::Handshake("for node 3, this is node 2".into()),
                ),
                (
                    [handshake(1, 2), (u32::MAX).to_be_bytes().to_vec()].concat(),
                    FrameError::TooLarge(u32::MAX as usize),
                ),
                (
                    [handshake(1, 2), frame(&[0, 99, 1, 2])].concat(),
                    FrameError::Undecodable(String::new()),
                ),
                (
                    [
                        handshake(1, 2),
                        frame(&codec::encode_message(&message(3, 2, 0))),
                    ]
                    .concat(),
                    FrameError::Spoofed { peer: 1, got: 3 },
                ),
            ];
            for (bytes, want) in cases {
                let mut client = TcpStream::connect(addr).await.unwrap();
                client.write_all(&bytes).await.unwrap();
                let server = listener.accept().await.unwrap();
                let why = Inbound::connection(server, 2, &[1, 2, 3], &deliver).await;
                match (&why, &want) {
                    (FrameError::Undecodable(_), FrameError::Undecodable(_)) => {}
                    _ => assert_eq!(why, want),
                }
            }
            assert!(got.borrow().is_empty(), "nothing was delivered");
            // A good peer afterwards.
            let mut client = TcpStream::connect(addr).await.unwrap();
            client
                .write_all(
                    &[
                        handshake(3, 2),
                        frame(&codec::encode_message(&message(3, 2, 4))),
                    ]
                    .concat(),
                )
                .await
                .unwrap();
            drop(client);
            let server = listener.accept().await.unwrap();
            let why = Inbound::connection(server, 2, &[1, 2, 3], &deliver).await;
            assert_eq!(why, FrameError::Closed);
            assert_eq!(*got.borrow(), vec![message(3, 2, 4)]);
        });
    }

    /// A forwarded request is answered by the leader's handler; a payload
    /// the handler refuses, a frame over the limit or a non-member closes
    /// that connection only, and the next request is served; a node's
    /// requests in flight are bounded.
    #[test]
    fn forwarded_requests_are_answered_and_bad_ones_close_their_connection() {
        run(|| async {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            let handler: ForwardHandler = Rc::new(|from, bytes: Vec<u8>| {
                Box::pin(async move {
                    (bytes != b"bad")
                        .then(|| [format!("from {from}: ").as_bytes(), &bytes].concat())
                })
            });
            glommio::spawn_local(Inbound::serve(
                listener,
                2,
                Rc::new(RefCell::new([1, 2, 3].into_iter().collect())),
                Handlers::new(Rc::new(|_| {}), Some(handler)),
            ))
            .detach();
            let deadline = || crate::clock::monotonic() + Duration::from_secs(5);
            let answer = forward(1, 2, &addr, b"hello", deadline()).await;
            assert_eq!(answer, Ok(b"from 1: hello".to_vec()));
            let refused = forward(3, 2, &addr, b"bad", deadline()).await;
            assert!(
                matches!(refused, Err(ForwardError::NoAnswer(_))),
                "{refused:?}"
            );
            let stranger = forward(7, 2, &addr, b"hello", deadline()).await;
            assert!(
                matches!(stranger, Err(ForwardError::NoAnswer(_))),
                "{stranger:?}"
            );
            let mut client = TcpStream::connect(addr.as_str()).await.unwrap();
            client
                .write_all(
                    &[
                        handshake_with(FORWARD_MAGIC, 1, 2),
                        (u32::MAX).to_be_bytes().to_vec(),
                    ]
                    .concat(),
                )
                .await
                .unwrap();
            let mut rest = Vec::new();
            let _ = client.read_to_end(&mut rest).await;
            assert!(rest.is_empty(), "closed unanswered");
            let answer = forward(3, 2, &addr, b"again", deadline()).await;
            assert_eq!(answer, Ok(b"from 3: again".to_vec()));
            // Nothing listens: not sent.
            let dead = forward(1, 2, "127.0.0.1:1", b"x", deadline()).await;
            assert!(matches!(dead, Err(ForwardError::NotSent(_))), "{dead:?}");
            // A node with FORWARDS_IN_FLIGHT_MAX requests open gets no more
            // served; another node still does, and so does the first once
            // one of its own ends.
            let mut open = Vec::new();
            for _ in 0..FORWARDS_IN_FLIGHT_MAX {
                let mut c = TcpStream::connect(addr.as_str()).await.unwrap();
                c.write_all(&handshake_with(FORWARD_MAGIC, 1, 2))
                    .await
                    .unwrap();
                open.push(c);
            }
            glommio::timer::sleep(Duration::from_millis(100)).await;
            let over = forward(1, 2, &addr, b"one more", deadline()).await;
            assert!(matches!(over, Err(ForwardError::NoAnswer(_))), "{over:?}");
            let other = forward(3, 2, &addr, b"other", deadline()).await;
            assert_eq!(other, Ok(b"from 3: other".to_vec()));
            drop(open.pop());
            glommio::timer::sleep(Duration::from_millis(100)).await;
            let again = forward(1, 2, &addr, b"later", deadline()).await;
            assert_eq!(again, Ok(b"from 1: later".to_vec()));
        });
    }

    /// Node 2's listener over `members`, its join handler answering
    /// "join {from}: {request}" (after 3 s for the request "slow"): its
    /// address and the Raft messages it delivers.
    fn serve_joins(members: Members) -> (String, Rc<RefCell<Vec<Message>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let got = Rc::new(RefCell::new(Vec::new()));
        let sink = got.clone();
        let handler: ForwardHandler = Rc::new(|from, bytes: Vec<u8>| {
            Box::pin(async move {
                if bytes == b"slow" {
                    glommio::timer::sleep(Duration::from_secs(3)).await;
                }
                Some([format!("join {from}: ").as_bytes(), &bytes].concat())
            })
        });
        glommio::spawn_local(Inbound::serve(
            listener,
            2,
            members,
            Handlers::new(Rc::new(move |m: Message| sink.borrow_mut().push(m)), None)
                .with_join(handler),
        ))
        .detach();
        (addr, got)
    }

    /// A node outside the membership may open a join connection only: its
    /// join is answered, its Raft connection refused until the controller
    /// adds it to the shared membership, then taken; join requests in
    /// flight are bounded and an oversized one closes its connection.
    #[test]
    fn a_non_member_may_only_join_until_it_is_a_member() {
        run(|| async {
            let members: Members = Rc::new(RefCell::new([1, 2, 3].into_iter().collect()));
            let (addr, got) = serve_joins(members.clone());
            let deadline = || crate::clock::monotonic() + Duration::from_secs(5);
            let answer = join(7, 2, &addr, b"10.0.0.7:9093", deadline()).await;
            assert_eq!(answer, Ok(b"join 7: 10.0.0.7:9093".to_vec()));
            // Not a member: its Raft connection is closed, nothing delivered.
            let peers = Peers::start(7, &[(2, addr.clone())]);
            assert!(peers.send(message(7, 2, 0)));
            glommio::timer::sleep(Duration::from_millis(300)).await;
            assert!(got.borrow().is_empty());
            drop(peers);
            // Added: taken from its next connection on.
            members.borrow_mut().insert(7);
            let peers = Peers::start(7, &[(2, addr.clone())]);
            assert!(peers.send(message(7, 2, 1)));
            wait_until(|| got.borrow().len() == 1).await;
            assert_eq!(got.borrow()[0], message(7, 2, 1));
            // Over the size limit: not sent.
            let big = vec![b'x'; JOIN_BYTES_MAX + 1];
            let over = join(8, 2, &addr, &big, deadline()).await;
            assert!(matches!(over, Err(ForwardError::NotSent(_))), "{over:?}");
            // JOINS_IN_FLIGHT_MAX slow joins: one more is closed unanswered.
            let mut slow = Vec::new();
            for i in 0..JOINS_IN_FLIGHT_MAX as u64 {
                let a = addr.clone();
                slow.push(glommio::spawn_local(async move {
                    join(20 + i, 2, &a, b"slow", deadline()).await
                }));
            }
            glommio::timer::sleep(Duration::from_millis(300)).await;
            let refused = join(30, 2, &addr, b"one more", deadline()).await;
            assert!(
                matches!(refused, Err(ForwardError::NoAnswer(_))),
                "{refused:?}"
            );
            for t in slow {
                assert!(t.await.is_ok());
            }
            let again = join(31, 2, &addr, b"later", deadline()).await;
            assert_eq!(again, Ok(b"join 31: later".to_vec()));
        });
    }

    /// A learner the quorum removed: the controller takes it out of the
    /// shared membership, and its open Raft connection is closed at its
    /// next frame (nothing more delivered), a new one refused at the
    /// handshake; a join is still answered (it may come back). Its sender
    /// on this side is stopped.
    #[test]
    fn a_removed_learner_is_refused_again_except_to_join() {
        run(|| async {
            let members: Members = Rc::new(RefCell::new([1, 2, 3, 7].into_iter().collect()));
            let (addr, got) = serve_joins(members.clone());
            let learner = Peers::start(7, &[(2, addr.clone())]);
            assert!(learner.send(message(7, 2, 0)));
            wait_until(|| got.borrow().len() == 1).await;
            // Removed: its connection delivers nothing more.
            members.borrow_mut().remove(&7);
            assert!(learner.send(message(7, 2, 1)));
            glommio::timer::sleep(Duration::from_millis(300)).await;
            assert_eq!(got.borrow().len(), 1);
            drop(learner);
            // A new connection is refused at the handshake.
            let again = Peers::start(7, &[(2, addr.clone())]);
            assert!(again.send(message(7, 2, 2)));
            glommio::timer::sleep(Duration::from_millis(300)).await;
            assert_eq!(got.borrow().len(), 1);
            drop(again);
            // Joining is still answered.
            let deadline = crate::clock::monotonic() + Duration::from_secs(5);
            let answer = join(7, 2, &addr, b"10.0.0.7:9093", deadline).await;
            assert_eq!(answer, Ok(b"join 7: 10.0.0.7:9093".to_vec()));
            // The leader's side: its sender to the learner is stopped.
            let mut peers = Peers::start(2, &[(7, "127.0.0.1:1".into())]);
            assert!(peers.has(7));
            peers.remove(7);
            assert!(!peers.has(7));
            assert!(!peers.send(message(2, 7, 0)));
        });
    }

    /// A peer that never answers: its queue fills and further messages are
    /// dropped, not buffered.
    #[test]
    fn a_dead_peers_queue_is_bounded() {
        run(|| async {
            // Nothing listens on port 1 of loopback.
            let peers = Peers::start(1, &[(2, "127.0.0.1:1".into())]);
            let mut sent = 0;
            for i in 0..(QUEUE_MESSAGES as u64 * 2) {
                if peers.send(message(1, 2, i)) {
                    sent += 1;
                }
            }
            assert!(sent <= QUEUE_MESSAGES + 1, "{sent}");
            assert_eq!(peers.dropped(), QUEUE_MESSAGES as u64 * 2 - sent as u64);
        });
    }
}

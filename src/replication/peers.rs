//! A shard's client connections to other nodes' brokers, for the requests
//! a broker sends on a transaction's behalf (`docs/replication.md` §4.7):
//! a coordinator's WriteTxnMarkers to a partition's leader, a partition
//! leader's AddPartitionsToTxn to a transactional id's coordinator. They
//! are [`Connection`]s, the replica fetcher's Kafka client, reached at the
//! broker's PLAINTEXT endpoint as a fetcher reaches its leader
//! ([`leader_address`]).
//!
//! Bounded: at most [`CONNECTIONS_PER_BROKER`] connections per destination
//! broker and shard, one request in flight on each (a caller waits for a
//! free one, until its deadline); a connection that failed in any way is
//! closed and the next caller opens a new one; every request, the wait
//! for a connection and the connect included, ends by its deadline.

use super::client::{ClientError, Connection};
use super::manager::{leader_address, NoAddress};
use crate::metadata::MetadataImage;
use glommio::sync::{Semaphore, StaticPermit};
use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::Request;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Instant;

/// Connections one shard keeps to one broker of another node.
pub const CONNECTIONS_PER_BROKER: u64 = 2;

/// Why a request to another broker got no answer.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("the broker has no address: {0:?}")]
    NoAddress(NoAddress),
    #[error("{0}")]
    Client(#[from] ClientError),
    #[error("no answer by the deadline")]
    TimedOut,
}

/// One destination broker: its free connections and the permits that
/// bound how many exist.
struct Destination {
    permits: Rc<Semaphore>,
    /// Connections not in use, each with the address it was opened to.
    idle: RefCell<Vec<(String, Connection)>>,
}

/// The connections of one shard (see the module doc).
pub struct PeerClients {
    client_id: String,
    destinations: RefCell<HashMap<i32, Rc<Destination>>>,
}

/// A connection checked out for one request; [`PeerConn::release`] after
/// a good answer returns it, dropping it closes it.
pub struct PeerConn {
    address: String,
    conn: Option<Connection>,
    destination: Rc<Destination>,
    _permit: StaticPermit,
}

impl PeerClients {
    /// The connections of broker `broker_id` (this shard), which names
    /// itself `fjord-broker-<id>` to its peers.
    pub fn new(broker_id: i32) -> PeerClients {
        PeerClients {
            client_id: format!("fjord-broker-{broker_id}"),
            destinations: RefCell::new(HashMap::new()),
        }
    }

    /// A connection to `broker` (at its address in `image`), waiting for a
    /// free one and connecting if needed, all by `deadline`.
    pub async fn checkout(
        &self,
        image: &MetadataImage,
        broker: i32,
        deadline: Instant,
    ) -> Result<PeerConn, PeerError> {
        let address = leader_address(image, broker).map_err(PeerError::NoAddress)?;
        let destination = self
            .destinations
            .borrow_mut()
            .entry(broker)
            .or_insert_with(|| {
                Rc::new(Destination {
                    permits: Rc::new(Semaphore::new(CONNECTIONS_PER_BROKER)),
                    idle: RefCell::new(Vec::new()),
                })
            })
            .clone();
        let permit = crate::runtime::within(deadline, destination.permits.acquire_static_permit(1))
            .await
            .ok_or(PeerError::TimedOut)?
            .map_err(|e| {
                PeerError::Client(ClientError::Io(std::io::Error::other(e.to_string())))
            })?;
        // An idle connection to the broker's current address; one to an
        // address it no longer has is closed.
        let reused = {
            let mut idle = destination.idle.borrow_mut();
            idle.retain(|(a, _)| *a == address);
            idle.pop().map(|(_, c)| c)
        };
        let conn = match reused {
            Some(c) => c,
            None => {
                let left = deadline.saturating_duration_since(crate::clock::monotonic());
                let open = Connection::open(&address, &self.client_id, left);
                crate::runtime::within(deadline, open)
                    .await
                    .ok_or(PeerError::TimedOut)??
            }
        };
        Ok(PeerConn {
            address,
            conn: Some(conn),
            destination,
            _permit: permit,
        })
    }
}

impl PeerConn {
    /// The version of `api` to send: the newest both sides speak, at most
    /// `ours`, at least `need`.
    pub fn version(&self, api: ApiKey, need: i16, ours: i16) -> Result<i16, PeerError> {
        match &self.conn {
            Some(c) => Ok(c.version(api, need, ours)?),
            None => Err(PeerError::TimedOut),
        }
    }

    /// Sends `req` at `version` and reads its answer by `deadline`. A
    /// failure closes the connection.
    pub async fn request<R: Request>(
        &mut self,
        version: i16,
        req: &R,
        deadline: Instant,
    ) -> Result<R::Response, PeerError> {
        let Some(conn) = self.conn.as_mut() else {
            return Err(PeerError::TimedOut);
        };
        let left = deadline.saturating_duration_since(crate::clock::monotonic());
        match conn.request(version, req, left).await {
            Ok(r) => Ok(r),
            Err(e) => {
                self.conn = None;
                Err(e.into())
            }
        }
    }

    /// Returns the connection for the next request.
    pub fn release(mut self) {
        if let Some(c) = self.conn.take() {
            self.destination
                .idle
                .borrow_mut()
                .push((std::mem::take(&mut self.address), c));
        }
    }
}

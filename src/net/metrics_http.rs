//! The metrics endpoint (`--metrics-listen`, default 127.0.0.1:9644): a
//! small HTTP/1.1 server on shard 0 serving `/metrics` (Prometheus text, or
//! OpenMetrics when the `Accept` header asks for it), `/healthz`,
//! `/readyz` and `/loglevel`.
//!
//! It runs on shard 0 in a task queue of its own with few shares
//! (`METRICS_SHARES`, a tenth of the request queue's), so a scrape yields
//! to requests instead of delaying them; it never runs on the other shards
//! except to build their own sample when asked (`shard::metrics`). A scrape
//! asks every shard over the channel mesh and waits at most
//! `SCRAPE_TIMEOUT_MS` — below Prometheus' default scrape timeout of 10 s —
//! so one stuck shard costs the scrape its series (and raises
//! `fjord_scrape_shards_missing`), not the whole answer.
//!
//! - `/healthz`: 200 when every shard answers within `HEALTH_TIMEOUT_MS`
//!   (its reactor runs), else 503 naming those that did not.
//! - `/readyz`: 200 when every shard answers, has applied the first
//!   metadata image (its partitions are recovered, it listens) and has
//!   loaded its group coordinator's partitions; else 503.
//!
//! - `GET /loglevel`: the log filter in force (`EnvFilter` directives);
//!   `PUT /loglevel` with a directive string as the body (e.g. `debug`, or
//!   `info,fjord::handlers=debug`) makes it the filter of every shard at
//!   once, without a restart (`crate::logging`); the body is at most
//!   `logging::FILTER_BYTES_MAX` bytes (413 beyond, 400 if it does not
//!   parse). Each change is logged at `warn` with the peer's address.
//!
//! One request per connection (`Connection: close`): a scraper connects
//! every few seconds, and keep-alive would buy nothing. The request head
//! is bounded (`REQUEST_HEAD_BYTES_MAX`) and, with its body, must arrive
//! within `REQUEST_READ_TIMEOUT_MS`. There is no authentication: the
//! default address is loopback. Whoever can reach the endpoint can read
//! every metric and set the log level — `trace` on every shard costs CPU
//! and fills the log's disk — so an address other than loopback must be
//! reachable only by operators (a firewall), as the README says.
//!
//! Only glommio (no tokio or hyper): the lean broker build includes it.

use crate::logging;
use crate::metrics::encode::{self, EncodeOptions};
use crate::metrics::ProcessSample;
use crate::shard::ShardCtx;
use futures_lite::io::{AsyncReadExt, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};
use std::rc::Rc;
use std::time::Duration;

/// Longest a scrape waits for the shards' samples.
pub const SCRAPE_TIMEOUT_MS: u64 = 5_000;
/// Longest `/healthz` and `/readyz` wait for every shard.
pub const HEALTH_TIMEOUT_MS: u64 = 1_000;
/// Longest request head (request line and headers) read.
pub const REQUEST_HEAD_BYTES_MAX: usize = 8 * 1024;
/// Longest a client may take to send its request head.
pub const REQUEST_READ_TIMEOUT_MS: u64 = 10_000;
/// Connections served at once; more wait in the listen backlog.
pub const CONNECTIONS_MAX: usize = 16;
/// A request body over its limit is still read, and dropped, up to this
/// many bytes before the refusal is sent (see `put_loglevel`).
pub const BODY_DRAIN_BYTES_MAX: usize = 64 * 1024;
/// Shares of the endpoint's task queue (requests run with 1000).
pub const METRICS_SHARES: usize = 100;

/// Binds the endpoint (an error names the flag, so a busy port is
/// understood at start-up).
pub fn bind(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    super::bind(addr)
}

/// Serves the endpoint until the task is dropped.
pub async fn serve(ctx: Rc<ShardCtx>, listener: TcpListener, start_time_seconds: f64) {
    let slots = Rc::new(glommio::sync::Semaphore::new(CONNECTIONS_MAX as u64));
    loop {
        let stream = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "metrics endpoint: accept failed");
                glommio::timer::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(permit) = slots.acquire_static_permit(1).await else {
            return;
        };
        let ctx = ctx.clone();
        glommio::spawn_local(async move {
            let _permit = permit;
            if let Err(e) = serve_one(&ctx, stream, start_time_seconds).await {
                tracing::debug!(error = %e, "metrics endpoint: connection failed");
            }
        })
        .detach();
    }
}

/// The parts of a request the endpoint looks at.
#[derive(Debug, PartialEq)]
struct Request {
    method: String,
    path: String,
    openmetrics: bool,
    /// `Content-Length`, if given (and a number).
    content_length: Option<usize>,
}

/// Parses a request head (`None`: not HTTP/1.x).
fn parse_head(head: &str) -> Option<Request> {
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let (method, target, version) = (first.next()?, first.next()?, first.next()?);
    if !version.starts_with("HTTP/1.") {
        return None;
    }
    let path = target.split('?').next().unwrap_or(target).to_string();
    let headers: Vec<(&str, &str)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim(), v.trim()))
        .collect();
    let named = |name: &'static str| {
        headers
            .iter()
            .filter(move |(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    };
    let openmetrics = named("accept").any(|v| v.contains("application/openmetrics-text"));
    let content_length = named("content-length").next().and_then(|v| v.parse().ok());
    Some(Request {
        method: method.to_string(),
        path,
        openmetrics,
        content_length,
    })
}

/// Reads up to the end of the request head; returns the head and the
/// bytes read after it (the start of a body).
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<(String, Vec<u8>)>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            return Ok(Some((head, buf[end + 4..].to_vec())));
        }
        if buf.len() > REQUEST_HEAD_BYTES_MAX {
            return Ok(None);
        }
    }
}

/// Reads the rest of a body of `len` bytes (`len` is at most
/// `logging::FILTER_BYTES_MAX`, checked by the caller); `started` holds
/// what came with the head. `None`: the peer closed first.
async fn read_body(
    stream: &mut TcpStream,
    mut started: Vec<u8>,
    len: usize,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut chunk = [0u8; 1024];
    while started.len() < len {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        started.extend_from_slice(&chunk[..n]);
    }
    started.truncate(len);
    Ok(Some(started))
}

/// An answer: status line, content type, body.
type Answer = (&'static str, &'static str, String);

const TEXT: &str = "text/plain; charset=utf-8";

async fn serve_one(
    ctx: &Rc<ShardCtx>,
    mut stream: TcpStream,
    start_time_seconds: f64,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_millis(REQUEST_READ_TIMEOUT_MS)))?;
    let request = read_head(&mut stream)
        .await?
        .and_then(|(h, rest)| Some((parse_head(&h)?, rest)));
    let (status, content_type, body) = match request {
        None => ("400 Bad Request", TEXT, "bad request\n".to_string()),
        Some((r, rest)) if r.method == "PUT" && r.path == "/loglevel" => {
            put_loglevel(&mut stream, &r, rest).await?
        }
        Some((r, _)) if r.method != "GET" => (
            "405 Method Not Allowed",
            TEXT,
            "GET, or PUT /loglevel\n".to_string(),
        ),
        Some((r, _)) => answer(ctx, &r, start_time_seconds).await,
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.flush().await?;
    Ok(())
}

/// `PUT /loglevel`: reads the directive string and applies it.
async fn put_loglevel(
    stream: &mut TcpStream,
    r: &Request,
    started: Vec<u8>,
) -> std::io::Result<Answer> {
    let Some(len) = r.content_length else {
        return Ok((
            "411 Length Required",
            TEXT,
            "a Content-Length is required\n".to_string(),
        ));
    };
    if len > logging::FILTER_BYTES_MAX {
        // Read (and drop) a body of moderate size first: closing a socket
        // with unread bytes resets the connection, and the client could
        // lose this answer to the reset.
        let mut left = len.min(BODY_DRAIN_BYTES_MAX).saturating_sub(started.len());
        let mut chunk = [0u8; 1024];
        while left > 0 {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            left = left.saturating_sub(n);
        }
        return Ok((
            "413 Content Too Large",
            TEXT,
            format!("{}\n", logging::FilterError::BadLength),
        ));
    }
    let Some(body) = read_body(stream, started, len).await? else {
        return Ok(("400 Bad Request", TEXT, "incomplete body\n".to_string()));
    };
    let Ok(directives) = std::str::from_utf8(&body) else {
        return Ok((
            "400 Bad Request",
            TEXT,
            "the body is not UTF-8\n".to_string(),
        ));
    };
    let before = logging::current_filter().unwrap_or_default();
    Ok(match logging::set_filter(directives) {
        Ok(now) => {
            let peer = stream.peer_addr().ok();
            tracing::warn!(?peer, from = %before, to = %now, "log filter changed");
            ("200 OK", TEXT, format!("{now}\n"))
        }
        Err(e @ logging::FilterError::NotInstalled) => {
            ("503 Service Unavailable", TEXT, format!("{e}\n"))
        }
        Err(e) => ("400 Bad Request", TEXT, format!("{e}\n")),
    })
}

async fn answer(ctx: &Rc<ShardCtx>, r: &Request, start_time_seconds: f64) -> Answer {
    match r.path.as_str() {
        "/loglevel" => match logging::current_filter() {
            Some(f) => ("200 OK", TEXT, format!("{f}\n")),
            None => (
                "503 Service Unavailable",
                TEXT,
                format!("{}\n", logging::FilterError::NotInstalled),
            ),
        },
        "/metrics" => {
            let deadline = crate::clock::monotonic() + Duration::from_millis(SCRAPE_TIMEOUT_MS);
            let answers = ctx.gather_samples(deadline).await;
            let mut process = ProcessSample::read(start_time_seconds);
            let mut samples = Vec::with_capacity(answers.len());
            for a in answers {
                match a {
                    Ok(s) => samples.push(s),
                    Err(e) => {
                        tracing::warn!(error = %e, "metrics scrape: a shard did not answer");
                        process.shards_missing += 1;
                    }
                }
            }
            let opts = EncodeOptions {
                openmetrics: r.openmetrics,
                partition_labels: ctx.config.metrics_partition_labels,
            };
            let content_type = if r.openmetrics {
                encode::OPENMETRICS_CONTENT_TYPE
            } else {
                encode::PROMETHEUS_CONTENT_TYPE
            };
            (
                "200 OK",
                content_type,
                encode::encode(&samples, &process, opts),
            )
        }
        "/healthz" | "/readyz" => {
            let deadline = crate::clock::monotonic() + Duration::from_millis(HEALTH_TIMEOUT_MS);
            let answers = ctx.gather_samples(deadline).await;
            let mut problems = Vec::new();
            for (shard, a) in answers.iter().enumerate() {
                match a {
                    Err(_) => problems.push(format!("shard {shard}: not answering")),
                    Ok(_) if r.path == "/healthz" => {}
                    Ok(s) if !s.ready => problems.push(format!("shard {shard}: recovering")),
                    Ok(s) if !s.coordinators_loaded => {
                        problems.push(format!("shard {shard}: loading group coordinators"))
                    }
                    Ok(_) => {}
                }
            }
            if problems.is_empty() {
                ("200 OK", TEXT, "ok\n".to_string())
            } else {
                ("503 Service Unavailable", TEXT, problems.join("\n") + "\n")
            }
        }
        _ => ("404 Not Found", TEXT, "not found\n".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_names_its_path_and_whether_openmetrics_is_accepted() {
        let r = parse_head("GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5").unwrap();
        assert_eq!(r.path, "/metrics");
        assert!(r.openmetrics);
        let r = parse_head("GET /metrics HTTP/1.0\r\naccept: text/plain").unwrap();
        assert!(!r.openmetrics);
        assert!(parse_head("GET /metrics SPDY/3").is_none());
        let r = parse_head("PUT /loglevel HTTP/1.1\r\ncontent-length: 5").unwrap();
        assert_eq!((r.method.as_str(), r.content_length), ("PUT", Some(5)));
        assert_eq!(
            parse_head("PUT /loglevel HTTP/1.1").unwrap().content_length,
            None
        );
        assert!(parse_head("").is_none());
    }
}

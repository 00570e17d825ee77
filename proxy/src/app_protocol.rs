//! Which protocol a request goes to its upstream in (the app, for the inbound role; a
//! downstream, for the egress role) when the configuration says `auto`.
//!
//! - HTTP/1.x callers: HTTP/1.1, as always.
//! - HTTP/2 callers (gRPC included): h2c if the upstream speaks h2c (prior knowledge),
//!   HTTP/1.1 otherwise, translated both ways (hyper does the framing, [`crate::service`]'s
//!   forwarding the URI and `Host`). Native gRPC needs HTTP/2 end to end: towards an
//!   upstream found to speak only HTTP/1.1 it gets a clear error, gRPC `UNIMPLEMENTED` with
//!   a message that says why, never a 502 (gRPC-Web, `application/grpc-web*`, works over
//!   HTTP/1.1 and is translated like any other request).
//!
//! What an upstream speaks is found by a probe, not assumed from the caller: weir opens a
//! connection of its own, sends the HTTP/2 client preface and an empty SETTINGS frame, and
//! reads the first 9 bytes of the answer. An h2c server answers with its own SETTINGS frame
//! (type 4 on stream 0: RFC 9113 3.4); an HTTP/1.1-only server answers `HTTP/1.1 400` (nginx,
//! hyper), `505`, or closes. No request is ever sent on the probe's connection, so the app's
//! handlers, access logs and metrics never see it, and a request is never lost or failed
//! because of it. The probe is 33 bytes written and 9 read: small enough to do by hand, and
//! no HTTP client offers "did the server send SETTINGS" (hyper's handshake returns before).
//!
//! The verdict is remembered per upstream address:
//! - the first HTTP/2 request to an address waits for the probe (one probe at a time; the
//!   others wait for its verdict), bounded by the connect timeout and the request's budget;
//! - a verdict older than [`RECHECK`] is re-checked in the background while requests keep
//!   using it (an app restarted with another server is found within that period);
//! - a request the upstream failed at the protocol level marks the verdict as suspect: the
//!   next HTTP/2 request re-checks it at once (in the background);
//! - a probe that cannot conclude (connect refused, no answer within the timeout) changes
//!   nothing it knew; with nothing known, gRPC goes over h2c and everything else over
//!   HTTP/1.1, and the next probe waits [`INCONCLUSIVE_BACKOFF`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Version};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::app_client::Protocol;
use crate::config::AppProtocol;

#[cfg(test)]
mod tests;

/// How long a verdict is used before it is re-checked (in the background).
pub const RECHECK: Duration = Duration::from_secs(30);

/// After a probe that could not conclude, how long before the next one.
pub const INCONCLUSIVE_BACKOFF: Duration = Duration::from_secs(1);

/// After a suspect verdict, at most one re-check per this long.
const SUSPECT_BACKOFF: Duration = Duration::from_secs(1);

/// The HTTP/2 client connection preface (RFC 9113 3.4) and an empty SETTINGS frame.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// GOAWAY, last stream 0, NO_ERROR: how the probe leaves an h2c server.
const GOAWAY: &[u8] = b"\x00\x00\x08\x07\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00";

const FRAME_SETTINGS: u8 = 0x4;

/// What an upstream was found to speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speaks {
    /// Not known (never probed, or no probe concluded).
    Unknown,
    /// h2c with prior knowledge (it may speak HTTP/1.1 too).
    H2c,
    /// HTTP/1.1, not h2c.
    Http1Only,
}

/// What a probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeResult {
    Speaks(Speaks),
    /// Connect failed or nothing came back in time: nothing learnt.
    Inconclusive(String),
}

/// Where a request goes, or why it cannot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    Send(Protocol),
    /// Native gRPC towards an upstream that speaks only HTTP/1.1.
    GrpcNeedsH2,
}

/// The protocol for one request: `configured` (`http1` / `h2c` force one), the caller's
/// HTTP version, whether it is native gRPC, and what the upstream is known to speak.
pub fn decide(configured: AppProtocol, caller: Version, grpc: bool, speaks: Speaks) -> Choice {
    match configured {
        AppProtocol::Http1 => Choice::Send(Protocol::Http1),
        AppProtocol::H2c => Choice::Send(Protocol::H2c),
        AppProtocol::Auto if caller < Version::HTTP_2 => Choice::Send(Protocol::Http1),
        AppProtocol::Auto => match speaks {
            Speaks::H2c => Choice::Send(Protocol::H2c),
            Speaks::Http1Only if grpc => Choice::GrpcNeedsH2,
            Speaks::Http1Only => Choice::Send(Protocol::Http1),
            // Nothing known: gRPC cannot work any other way; for the rest HTTP/1.1 is what
            // most apps speak.
            Speaks::Unknown if grpc => Choice::Send(Protocol::H2c),
            Speaks::Unknown => Choice::Send(Protocol::Http1),
        },
    }
}

/// Native gRPC (`application/grpc`, `application/grpc+proto`, `application/grpc;...`), which
/// needs HTTP/2; gRPC-Web (`application/grpc-web*`) does not.
pub fn is_native_grpc(headers: &HeaderMap) -> bool {
    let Some(ct) = headers.get(CONTENT_TYPE) else { return false };
    let ct = ct.as_bytes();
    match ct.strip_prefix(b"application/grpc") {
        Some(rest) => rest.is_empty() || rest[0] == b'+' || rest[0] == b';',
        None => false,
    }
}

/// The answer to a native gRPC request whose upstream speaks only HTTP/1.1: trailers-only,
/// `grpc-status: 12` (UNIMPLEMENTED: retrying cannot help) and a message saying why.
pub fn grpc_needs_h2_head() -> (StatusCode, HeaderMap) {
    let mut headers = HeaderMap::with_capacity(4);
    headers.insert(crate::refusal::WEIR_ERROR, HeaderValue::from_static("grpc-needs-h2"));
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(HeaderName::from_static("grpc-status"), HeaderValue::from_static("12"));
    headers.insert(
        HeaderName::from_static("grpc-message"),
        HeaderValue::from_static(
            "weir: the upstream speaks only HTTP/1.1 (app_protocol: auto probed it); \
             gRPC needs HTTP/2 (h2c) at the upstream",
        ),
    );
    (StatusCode::OK, headers)
}

/// Probes `addr`: connect, preface, first frame header; the whole exchange within
/// `timeout`.
pub async fn probe(addr: SocketAddr, timeout: Duration) -> ProbeResult {
    match tokio::time::timeout(timeout, probe_unbounded(addr)).await {
        Ok(result) => result,
        Err(_) => ProbeResult::Inconclusive(format!("no answer from {addr} within {timeout:?}")),
    }
}

async fn probe_unbounded(addr: SocketAddr) -> ProbeResult {
    let mut stream = match TcpStream::connect(addr).await {
        Ok(s) => s,
        Err(e) => return ProbeResult::Inconclusive(format!("connect to {addr}: {e}")),
    };
    let _ = stream.set_nodelay(true);
    if let Err(e) = stream.write_all(PREFACE).await {
        // Accepted, then refused the bytes: not an h2c server.
        return refused_by(e);
    }
    let mut head = [0u8; 9];
    match stream.read_exact(&mut head).await {
        Ok(_) => {
            let stream_id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            if head[3] == FRAME_SETTINGS && stream_id == 0 {
                let _ = stream.write_all(GOAWAY).await;
                let _ = stream.shutdown().await;
                ProbeResult::Speaks(Speaks::H2c)
            } else {
                ProbeResult::Speaks(Speaks::Http1Only)
            }
        }
        Err(e) => refused_by(e),
    }
}

/// The upstream closed or reset the connection on the preface: it does not speak h2c.
fn refused_by(e: std::io::Error) -> ProbeResult {
    use std::io::ErrorKind::*;
    match e.kind() {
        UnexpectedEof | ConnectionReset | BrokenPipe | ConnectionAborted => {
            ProbeResult::Speaks(Speaks::Http1Only)
        }
        _ => ProbeResult::Inconclusive(e.to_string()),
    }
}

/// What one upstream address speaks, as far as weir knows, and the probes that find out.
#[derive(Debug, Clone)]
pub struct Upstream {
    inner: Arc<Memory>,
}

#[derive(Debug)]
struct Memory {
    addr: SocketAddr,
    timeout: Duration,
    /// [`Speaks`] as 0 / 1 / 2.
    speaks: AtomicU8,
    /// When the verdict is due for a re-check (nanoseconds since [`epoch`]).
    recheck_at: AtomicU64,
    /// When the last probe started (nanoseconds since [`epoch`]; 0: never).
    last_probe: AtomicU64,
    /// A background re-check is running.
    rechecking: AtomicBool,
    /// While nothing is known: one probe at a time, the others wait for its verdict.
    first: tokio::sync::Mutex<()>,
}

impl Upstream {
    /// `timeout` bounds each probe (connect and answer).
    pub fn new(addr: SocketAddr, timeout: Duration) -> Self {
        Upstream {
            inner: Arc::new(Memory {
                addr,
                timeout,
                speaks: AtomicU8::new(0),
                recheck_at: AtomicU64::new(u64::MAX),
                last_probe: AtomicU64::new(0),
                rechecking: AtomicBool::new(false),
                first: tokio::sync::Mutex::new(()),
            }),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// What the upstream is known to speak now.
    pub fn speaks(&self) -> Speaks {
        self.inner.speaks()
    }

    /// The protocol for a request (see [`decide`]), and the time after choosing it. Under
    /// `auto`, an HTTP/2 caller's request may wait for the first probe of this upstream,
    /// never past `deadline`. `now`: a clock read the caller has just made, used for the
    /// re-check's schedule and returned as is when nothing was waited for (one clock read
    /// fewer per request); after a wait for the probe, tokio's clock is read again.
    pub async fn choose(
        &self,
        configured: AppProtocol,
        caller: Version,
        headers: &HeaderMap,
        now: Instant,
        deadline: Instant,
    ) -> (Choice, Instant) {
        if configured != AppProtocol::Auto || caller < Version::HTTP_2 {
            // Nothing to learn: the caller's version or the configuration decides.
            return (decide(configured, caller, false, Speaks::Unknown), now);
        }
        let memory = &self.inner;
        let speaks = match memory.speaks() {
            Speaks::Unknown => {
                // Boxed: only the first requests wait for the probe; the rest should not
                // carry its state.
                let speaks = Box::pin(memory.learn(deadline)).await;
                let now = tokio::time::Instant::now().into_std();
                return (decide(configured, caller, is_native_grpc(headers), speaks), now);
            }
            known => known,
        };
        if since_epoch(now) >= memory.recheck_at.load(Acquire) {
            self.recheck_in_background();
        }
        (decide(configured, caller, is_native_grpc(headers), speaks), now)
    }

    /// A request sent in the remembered protocol failed at the protocol level: re-check
    /// soon (at most once per [`SUSPECT_BACKOFF`]).
    pub fn suspect(&self) {
        let memory = &self.inner;
        if memory.speaks() == Speaks::Unknown {
            return;
        }
        let now = since_epoch(Instant::now());
        let soonest = memory.last_probe.load(Acquire).saturating_add(nanos(SUSPECT_BACKOFF));
        memory.recheck_at.fetch_min(now.max(soonest), AcqRel);
    }

    fn recheck_in_background(&self) {
        let memory = self.inner.clone();
        if memory.rechecking.swap(true, AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            memory.rechecking.store(false, Release);
            return;
        };
        runtime.spawn(async move {
            memory.run_probe().await;
            memory.rechecking.store(false, Release);
        });
    }
}

impl Memory {
    fn speaks(&self) -> Speaks {
        match self.speaks.load(Acquire) {
            1 => Speaks::H2c,
            2 => Speaks::Http1Only,
            _ => Speaks::Unknown,
        }
    }

    /// Nothing known: probe (one caller at a time), unless a probe just failed to conclude.
    async fn learn(&self, deadline: Instant) -> Speaks {
        let Ok(_turn) = tokio::time::timeout_at(deadline.into(), self.first.lock()).await else {
            return self.speaks();
        };
        let known = self.speaks();
        let last = self.last_probe.load(Acquire);
        let backing_off = last != 0
            && since_epoch(Instant::now()) < last.saturating_add(nanos(INCONCLUSIVE_BACKOFF));
        if known != Speaks::Unknown || backing_off {
            return known;
        }
        // A probe cut short by the request's budget still counts as an attempt.
        let _ = tokio::time::timeout_at(deadline.into(), self.run_probe()).await;
        self.speaks()
    }

    /// One probe; a conclusive answer is remembered until [`RECHECK`] from now.
    async fn run_probe(&self) {
        self.last_probe.store(since_epoch(Instant::now()).max(1), Release);
        match probe(self.addr, self.timeout).await {
            ProbeResult::Speaks(found) => {
                let code = match found {
                    Speaks::Unknown => 0,
                    Speaks::H2c => 1,
                    Speaks::Http1Only => 2,
                };
                let before = self.speaks();
                self.speaks.store(code, Release);
                self.recheck_at.store(since_epoch(Instant::now()) + nanos(RECHECK), Release);
                if before != found {
                    match found {
                        Speaks::H2c => tracing::info!(
                            upstream = %self.addr,
                            "app_protocol auto: the upstream speaks h2c; HTTP/2 callers' requests go over h2c"
                        ),
                        _ => tracing::info!(
                            upstream = %self.addr,
                            "app_protocol auto: the upstream speaks only HTTP/1.1; HTTP/2 callers' \
                             requests are translated to HTTP/1.1 (native gRPC is refused with UNIMPLEMENTED)"
                        ),
                    }
                }
            }
            ProbeResult::Inconclusive(why) => {
                // Keep what was known; try again no sooner than the backoff.
                let again = since_epoch(Instant::now()) + nanos(INCONCLUSIVE_BACKOFF);
                if self.speaks() != Speaks::Unknown {
                    self.recheck_at.store(again, Release);
                }
                tracing::debug!(upstream = %self.addr, %why, "app_protocol auto: probe inconclusive");
            }
        }
    }
}

/// The [`Upstream`]s of many addresses (the egress role's downstreams), at most `max`
/// remembered; beyond that, one is forgotten to make room.
#[derive(Debug)]
pub struct Upstreams {
    timeout: Duration,
    max: usize,
    known: Mutex<HashMap<SocketAddr, Upstream>>,
}

impl Upstreams {
    pub fn new(timeout: Duration, max: usize) -> Self {
        Upstreams { timeout, max: max.max(1), known: Mutex::new(HashMap::new()) }
    }

    pub fn get(&self, addr: SocketAddr) -> Upstream {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(u) = known.get(&addr) {
            return u.clone();
        }
        if known.len() >= self.max {
            if let Some(evict) = known.keys().next().copied() {
                known.remove(&evict);
            }
        }
        let upstream = Upstream::new(addr, self.timeout);
        known.insert(addr, upstream.clone());
        upstream
    }
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}

/// A process-wide origin for instants kept in atomics.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn since_epoch(t: Instant) -> u64 {
    nanos(t.saturating_duration_since(epoch()))
}

//! Misbehaving peers for the protocol-edge tests (`proxy/tests/e2e/edge_*.rs`), the
//! well-behaved caller that must still be served next to them. (`edge_sidecar`, the sidecar
//! those tests configure, is in the e2e binary's `support::misbehaving`.)
//!
//! `WEIR_EDGE_DISARM=1` turns every guard the edge tests rely on (timeouts, stream and
//! per-connection caps) into something huge: each guard test must then fail, which is how we
//! check that they can. (Before the pingora data plane was removed, the same 15 cases ran
//! against it too: 14 failed there, all but tonic's refusal; see BENCHMARKS.md, "Proxy
//! overhead", for the side-by-side that decided between the two planes.)

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weir_workload::backend::HttpServer;

use super::client::Http1;

/// Slack on top of a configured timeout before a test calls it missed: generous, because the
/// machine running the suite has 2 busy cores.
pub const MARGIN: Duration = Duration::from_secs(3);

/// The short timeout the edge tests configure for the guard under test.
pub const SHORT: Duration = Duration::from_millis(400);

/// Whether the guards are disarmed (`WEIR_EDGE_DISARM=1`), to prove the tests can fail.
pub fn disarmed() -> bool {
    std::env::var("WEIR_EDGE_DISARM").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// `d`, or an hour when the guards are disarmed.
pub fn guard(d: Duration) -> Duration {
    if disarmed() {
        Duration::from_secs(3600)
    } else {
        d
    }
}

/// `n`, or something no test reaches when the guards are disarmed (65,536: the largest
/// stream count the configuration accepts).
pub fn guard_count(n: usize) -> usize {
    if disarmed() {
        65_536
    } else {
        n
    }
}

/// The well-behaved caller's priority: the most important, so that admission control
/// reacting to the queue a misbehaving caller built never refuses it.
pub const IMPORTANT: [(&str, &str); 2] = [("x-business-priority", "0"), ("x-user-priority", "0")];

/// A well-behaved caller on a fresh HTTP/1.1 connection: `GET /echo?probe` must be answered
/// 200, with the admission level, within `within`. Returns how long it took.
pub async fn served_within(addr: SocketAddr, within: Duration) -> Duration {
    let started = Instant::now();
    let url = format!("http://{addr}/echo?probe");
    let resp = tokio::time::timeout(within, Http1::new().get(&url, &IMPORTANT))
        .await
        .unwrap_or_else(|_| panic!("a well-behaved caller was not answered within {within:?}"));
    assert_eq!(resp.status, 200, "well-behaved caller: {resp:?}");
    resp.level();
    started.elapsed()
}

/// A well-behaved caller whose response has a body (an empty one needs no flow-control
/// window, so it would pass where a real response stalls): `GET /bytes/4096` on a fresh
/// HTTP/1.1 connection must be answered 200 with all 4,096 bytes and the level within
/// `within`. Returns how long it took.
pub async fn probe(addr: SocketAddr, within: Duration) -> Duration {
    let started = Instant::now();
    let url = format!("http://{addr}/bytes/4096?probe");
    let resp = tokio::time::timeout(within, Http1::new().get(&url, &IMPORTANT))
        .await
        .unwrap_or_else(|_| panic!("a well-behaved caller was not answered within {within:?}"));
    assert_eq!(resp.status, 200, "well-behaved caller: {resp:?}");
    assert_eq!(resp.body.len(), 4096, "well-behaved caller: the whole body");
    resp.level();
    started.elapsed()
}

/// The well-behaved caller's latencies, `n` probes one after another (each must be answered
/// within `within`).
pub async fn probe_series(addr: SocketAddr, n: usize, within: Duration) -> Latencies {
    let mut l = Latencies::default();
    for _ in 0..n {
        l.0.push(probe(addr, within).await);
    }
    l
}

/// The well-behaved caller's unattacked latencies: `n` probes after a few to warm up (the
/// sidecar's first connection to the app, the allocator).
pub async fn unattacked_series(addr: SocketAddr, n: usize, within: Duration) -> Latencies {
    probe_series(addr, 5, within).await;
    probe_series(addr, n, within).await
}

/// Latencies of a series of requests.
#[derive(Debug, Clone, Default)]
pub struct Latencies(pub Vec<Duration>);

impl Latencies {
    pub fn quantile(&self, q: f64) -> Duration {
        let mut v = self.0.clone();
        v.sort_unstable();
        if v.is_empty() {
            return Duration::ZERO;
        }
        v[((v.len() - 1) as f64 * q).round() as usize]
    }

    pub fn max(&self) -> Duration {
        self.0.iter().copied().max().unwrap_or_default()
    }

    /// One line for the report: the unattacked series beside the attacked one.
    pub fn report(case: &str, unattacked: &Latencies, attacked: &Latencies) {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        eprintln!(
            "[{case}] well-behaved caller: unattacked p50 {:.2} ms p99 {:.2} ms (n={}); under \
             attack p50 {:.2} ms p99 {:.2} ms max {:.2} ms (n={}); p99 delta {:+.2} ms",
            ms(unattacked.quantile(0.5)),
            ms(unattacked.quantile(0.99)),
            unattacked.0.len(),
            ms(attacked.quantile(0.5)),
            ms(attacked.quantile(0.99)),
            ms(attacked.max()),
            attacked.0.len(),
            ms(attacked.quantile(0.99)) - ms(unattacked.quantile(0.99)),
        );
    }
}

// === raw HTTP/2 peers ===

/// An h2 peer that completes the handshake (preface, SETTINGS, and the ACK of weir's
/// SETTINGS) and then answers nothing, PINGs included: after GOAWAY, h2's graceful close
/// waits for the ACK of its PING, which never comes.
pub struct SilentH2Peer {
    stream: TcpStream,
}

impl SilentH2Peer {
    pub async fn connect(addr: SocketAddr) -> SilentH2Peer {
        SilentH2Peer::try_connect(addr).await.unwrap_or_else(|e| panic!("silent h2 peer: {e}"))
    }

    /// [`SilentH2Peer::connect`], or why the handshake did not complete within [`MARGIN`]
    /// (e.g. weir closed the connection on accept at `max_connections`).
    pub async fn try_connect(addr: SocketAddr) -> Result<SilentH2Peer, String> {
        let io = |e: std::io::Error| e.to_string();
        let mut stream = TcpStream::connect(addr).await.map_err(io)?;
        stream.set_nodelay(true).map_err(io)?;
        stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.map_err(io)?;
        // An empty SETTINGS frame: length 0, type 4, flags 0, stream 0.
        stream.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.map_err(io)?;
        // Read frames until weir's own SETTINGS (not an ACK), then acknowledge it.
        let deadline = Instant::now() + MARGIN;
        loop {
            let (kind, flags, _) = read_frame(&mut stream, deadline)
                .await
                .map_err(|e| format!("no SETTINGS from weir: {e:?}"))?;
            if kind == 4 && flags & 1 == 0 {
                break;
            }
        }
        stream.write_all(&[0, 0, 0, 4, 1, 0, 0, 0, 0]).await.map_err(io)?;
        Ok(SilentH2Peer { stream })
    }

    /// Reads (and ignores) frames until weir closes the connection; `Err` if it is still
    /// open at `deadline`. Returns the frame types seen (7 = GOAWAY, 6 = PING).
    pub async fn closed_by(&mut self, deadline: Instant) -> Result<Vec<u8>, String> {
        let mut kinds = Vec::new();
        loop {
            match read_frame(&mut self.stream, deadline).await {
                Ok((kind, _, _)) => kinds.push(kind),
                Err(FrameError::Closed) => return Ok(kinds),
                Err(FrameError::Timeout) => {
                    return Err(format!("still open; frames seen: {kinds:?}"));
                }
            }
        }
    }
}

#[derive(Debug)]
enum FrameError {
    Closed,
    Timeout,
}

/// One h2 frame's type, flags and payload.
async fn read_frame(
    stream: &mut TcpStream,
    deadline: Instant,
) -> Result<(u8, u8, Vec<u8>), FrameError> {
    let left = || deadline.saturating_duration_since(Instant::now());
    let mut head = [0u8; 9];
    match tokio::time::timeout(left(), stream.read_exact(&mut head)).await {
        Err(_) => return Err(FrameError::Timeout),
        Ok(Err(_)) => return Err(FrameError::Closed),
        Ok(Ok(_)) => {}
    }
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    match tokio::time::timeout(left(), stream.read_exact(&mut payload)).await {
        Err(_) => Err(FrameError::Timeout),
        Ok(Err(_)) => Err(FrameError::Closed),
        Ok(Ok(_)) => Ok((head[3], head[4], payload)),
    }
}

// === misbehaving apps ===

/// An HTTP/1.1 app (raw TCP) that answers the first request on each connection with
/// keep-alive and then, when the next request arrives on it, closes the connection without
/// answering: what an app that times idle connections out does to a request sent just as it
/// closes (gunicorn after 2 s, node and uvicorn after 5 s). Deterministic, unlike the race.
pub struct ClosingKeepAliveApp {
    pub addr: SocketAddr,
    /// Requests answered (200), and requests dropped by closing.
    pub answered: Arc<AtomicU64>,
    pub dropped: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl ClosingKeepAliveApp {
    pub async fn start() -> ClosingKeepAliveApp {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let answered = Arc::new(AtomicU64::new(0));
        let dropped = Arc::new(AtomicU64::new(0));
        let (a, d) = (answered.clone(), dropped.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else { continue };
                let (a, d) = (a.clone(), d.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    if read_head(&mut stream, &mut buf).await.is_err() {
                        return;
                    }
                    let body = b"kept-alive";
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nx-app: closing\r\n\r\n",
                        body.len()
                    );
                    if stream.write_all(head.as_bytes()).await.is_err()
                        || stream.write_all(body).await.is_err()
                    {
                        return;
                    }
                    a.fetch_add(1, Relaxed);
                    // The next request on this connection is dropped by closing.
                    buf.clear();
                    if read_head(&mut stream, &mut buf).await.is_ok() {
                        d.fetch_add(1, Relaxed);
                    }
                });
            }
        });
        ClosingKeepAliveApp { addr, answered, dropped, task }
    }
}

impl Drop for ClosingKeepAliveApp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads one request head (the tests' requests to this app have no body).
async fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<(), ()> {
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match tokio::time::timeout(Duration::from_secs(30), stream.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return Err(()),
        }
    }
    Ok(())
}

/// A hyper app that reads each request's whole body before it answers (200 with the body's
/// length; `/bytes/<n>`: `n` bytes, for [`probe`]), as most apps do: a request body that
/// fails reaches weir before any response.
pub struct BodyFirstApp {
    pub addr: SocketAddr,
    pub arrivals: Arc<AtomicU64>,
    /// Requests whose body the app could not read to its end.
    pub broken_bodies: Arc<AtomicU64>,
    _server: HttpServer,
}

impl BodyFirstApp {
    pub async fn start() -> BodyFirstApp {
        use http_body_util::BodyExt;
        let arrivals = Arc::new(AtomicU64::new(0));
        let broken_bodies = Arc::new(AtomicU64::new(0));
        let (a, b) = (arrivals.clone(), broken_bodies.clone());
        let answer = move |req: http::Request<hyper::body::Incoming>| {
            let (a, b) = (a.clone(), b.clone());
            async move {
                a.fetch_add(1, Relaxed);
                let bytes = req.uri().path().strip_prefix("/bytes/");
                let bytes = bytes.and_then(|n| n.parse::<usize>().ok());
                let text = match req.into_body().collect().await {
                    Ok(c) => c.to_bytes().len().to_string(),
                    Err(_) => {
                        b.fetch_add(1, Relaxed);
                        "broken".to_string()
                    }
                };
                let answer = match bytes {
                    Some(n) => Bytes::from(vec![b'x'; n]),
                    None => Bytes::from(text),
                };
                http::Response::new(http_body_util::Full::new(answer))
            }
        };
        let server =
            HttpServer::bind(([127, 0, 0, 1], 0).into(), answer).await.expect("bind 127.0.0.1:0");
        BodyFirstApp { addr: server.addr(), arrivals, broken_bodies, _server: server }
    }
}

// === resources ===

/// Open file descriptors and resident memory of this process (the in-process sidecar and
/// the test's own clients together), from `/proc/self`.
pub fn fds_and_rss() -> (usize, u64) {
    let fds = std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0);
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let rss_kb = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    (fds, rss_kb * 1024)
}

// === raw HTTP/1.x over TCP ===

/// One HTTP/1.x response as read off the wire.
#[derive(Debug, Clone)]
pub struct RawResponse {
    pub version: String,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    /// The first value of `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn closes(&self) -> bool {
        self.header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }

    /// Every response from weir carries its admission level.
    pub fn level(&self) -> &str {
        self.header("x-admission-level")
            .unwrap_or_else(|| panic!("no x-admission-level on {self:?}"))
    }
}

/// A TCP connection speaking HTTP/1.x by hand, so a test can send what no client library
/// would (short, pipelined, malformed or never-ending requests) and read exactly what came
/// back. Every read is bounded by a deadline.
pub struct RawConn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl RawConn {
    pub async fn connect(addr: SocketAddr) -> RawConn {
        let stream = TcpStream::connect(addr).await.expect("connect to weir");
        stream.set_nodelay(true).unwrap();
        RawConn { stream, buf: Vec::new() }
    }

    /// A connection whose receive buffer is only `bytes` (the kernel may round it up a
    /// little), so a large response stalls quickly when it is not read.
    pub async fn connect_small_receive_buffer(addr: SocketAddr, bytes: u32) -> RawConn {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(bytes).unwrap();
        let stream = socket.connect(addr).await.expect("connect to weir");
        stream.set_nodelay(true).unwrap();
        RawConn { stream, buf: Vec::new() }
    }

    /// `n` HTTP/1.1 callers, each sending `GET {path}?stalled={i}` with `Host: host` on a
    /// small receive buffer and then never reading: the response stalls on them.
    pub async fn never_reading(addr: SocketAddr, n: usize, path: &str, host: &str) -> Vec<RawConn> {
        let mut readers = Vec::with_capacity(n);
        for i in 0..n {
            let mut raw = RawConn::connect_small_receive_buffer(addr, 4096).await;
            raw.send(format!("GET {path}?stalled={i} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
                .await;
            readers.push(raw);
        }
        readers
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write to weir");
    }

    /// Reads more into the buffer; `Ok(0)` is the peer's end of stream.
    async fn fill(&mut self, deadline: Instant) -> Result<usize, String> {
        let mut chunk = [0u8; 16 * 1024];
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, self.stream.read(&mut chunk)).await {
            Err(_) => Err(format!("nothing more within the deadline; have {:?}", self.shown())),
            Ok(Err(e)) => Err(format!("read failed: {e}")),
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(n)
            }
        }
    }

    fn shown(&self) -> String {
        String::from_utf8_lossy(&self.buf[..self.buf.len().min(300)]).into_owned()
    }

    async fn line(&mut self, deadline: Instant) -> Result<String, String> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8_lossy(&self.buf[..end]).into_owned();
                self.buf.drain(..end + 2);
                return Ok(line);
            }
            if self.fill(deadline).await? == 0 {
                return Err(format!("connection closed mid-line: {:?}", self.shown()));
            }
        }
    }

    async fn exact(&mut self, n: usize, deadline: Instant) -> Result<Vec<u8>, String> {
        while self.buf.len() < n {
            if self.fill(deadline).await? == 0 {
                return Err(format!(
                    "connection closed after {} of {n} body bytes",
                    self.buf.len()
                ));
            }
        }
        Ok(self.buf.drain(..n).collect())
    }

    /// The next response (a 1xx is returned as it is: call again for the final one).
    pub async fn response(&mut self, within: Duration) -> Result<RawResponse, String> {
        self.read_response(false, within).await
    }

    /// The next response to a HEAD request: no body follows its head.
    pub async fn head_response(&mut self, within: Duration) -> Result<RawResponse, String> {
        self.read_response(true, within).await
    }

    async fn read_response(&mut self, head: bool, within: Duration) -> Result<RawResponse, String> {
        let deadline = Instant::now() + within;
        let status_line = self.line(deadline).await?;
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default().to_string();
        let status = parts
            .next()
            .and_then(|s| s.parse::<u16>().ok())
            .ok_or_else(|| format!("not a status line: {status_line:?}"))?;
        let mut headers = Vec::new();
        loop {
            let line = self.line(deadline).await?;
            if line.is_empty() {
                break;
            }
            let (k, v) = line.split_once(':').ok_or_else(|| format!("bad header {line:?}"))?;
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
        let mut resp = RawResponse { version, status, headers, body: Vec::new() };
        if head || (100..200).contains(&status) || status == 204 || status == 304 {
            return Ok(resp);
        }
        if resp.header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
            loop {
                let size_line = self.line(deadline).await?;
                let hex = size_line.split(';').next().unwrap_or_default().trim();
                let size = usize::from_str_radix(hex, 16)
                    .map_err(|_| format!("bad chunk size {size_line:?}"))?;
                if size == 0 {
                    while !self.line(deadline).await?.is_empty() {}
                    break;
                }
                let chunk = self.exact(size + 2, deadline).await?;
                resp.body.extend_from_slice(&chunk[..size]);
            }
        } else if let Some(len) = resp.header("content-length") {
            let len: usize = len.parse().map_err(|_| format!("bad content-length {len:?}"))?;
            resp.body = self.exact(len, deadline).await?;
        } else {
            while self.fill(deadline).await? > 0 {}
            resp.body = std::mem::take(&mut self.buf);
        }
        Ok(resp)
    }

    /// Reads and discards until the peer closes (end of stream or reset). Returns the bytes
    /// that were still to read, or an error if the connection is still open after `within`.
    pub async fn closed_within(&mut self, within: Duration) -> Result<usize, String> {
        let deadline = Instant::now() + within;
        let mut total = std::mem::take(&mut self.buf).len();
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.stream.read(&mut chunk)).await {
                Err(_) => return Err(format!("still open after {within:?} ({total} bytes read)")),
                Ok(Ok(0)) | Ok(Err(_)) => return Ok(total),
                Ok(Ok(n)) => total += n,
            }
        }
    }
}

// === raw HTTP/2 ===

/// An h2 client connection (the `h2` crate, so a test controls flow control and stream
/// counts itself); the connection is driven by a spawned task.
pub async fn h2_connect(
    addr: SocketAddr,
    configure: impl FnOnce(&mut h2::client::Builder),
) -> h2::client::SendRequest<Bytes> {
    let tcp = TcpStream::connect(addr).await.expect("connect to weir");
    tcp.set_nodelay(true).unwrap();
    let mut builder = h2::client::Builder::new();
    configure(&mut builder);
    let (send, connection) = builder.handshake::<_, Bytes>(tcp).await.expect("h2 handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    send
}

/// A GET request for the h2 client.
pub fn h2_get(addr: SocketAddr, path_and_query: &str) -> http::Request<()> {
    http::Request::get(format!("http://{addr}{path_and_query}")).body(()).unwrap()
}

//! The skeleton with a role of its own, over real sockets: what every role gets from it.

use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;
use crate::config::{InboundConfig, ServerConfig};

/// Answers every request with `body`.
struct Fixed {
    body: Bytes,
    level: HeaderName,
}

impl LevelStamp for Fixed {
    fn level_header(&self) -> (&HeaderName, HeaderValue) {
        (&self.level, HeaderValue::from_static("1.2"))
    }
}

impl Role for Fixed {
    type Conn = ();

    async fn serve(
        self: Arc<Self>,
        _conn: Arc<()>,
        _req: Request<Incoming>,
    ) -> Response<ResponseBody> {
        Response::new(ResponseBody::full(self.body.clone(), None))
    }
}

const BOUND: Duration = Duration::from_secs(10);
const GET: &[u8] = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n";

struct Running {
    addr: std::net::SocketAddr,
    drain: weir_net::drain::Drain,
    served: tokio::task::JoinHandle<()>,
}

async fn start(body: Bytes, tweak: impl FnOnce(&mut ServerConfig)) -> Running {
    let mut config = InboundConfig::default().server();
    tweak(&mut config);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (drain, watch) = weir_net::drain::channel();
    let role = Arc::new(Fixed { body, level: HeaderName::from_static("x-admission-level") });
    let served = tokio::spawn(serve(listener, "test", role, Arc::new(config), watch));
    Running { addr, drain, served }
}

/// Reads one response whose body is `len` bytes.
async fn read_response(stream: &mut TcpStream, len: usize) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(BOUND, stream.read(&mut chunk)).await.unwrap().unwrap();
        assert!(n > 0, "closed mid-response: {}", String::from_utf8_lossy(&buf));
        buf.extend_from_slice(&chunk[..n]);
        if let Some(head) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            if buf.len() >= head + 4 + len {
                return String::from_utf8_lossy(&buf).into_owned();
            }
        }
    }
}

/// Whether the peer closes the connection within `within` (reading whatever is left).
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut chunk = [0u8; 65536];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn an_idle_connection_is_closed_after_timeouts_idle() {
    let running =
        start(Bytes::from_static(b"ok"), |c| c.timeouts.idle = Duration::from_millis(200)).await;
    let mut conn = TcpStream::connect(running.addr).await.unwrap();
    // The connection is idle from the response on, which is after this.
    let sent = Instant::now();
    conn.write_all(GET).await.unwrap();
    let response = read_response(&mut conn, 2).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(closed_within(&mut conn, BOUND).await, "closed for being idle");
    assert!(sent.elapsed() >= Duration::from_millis(200), "not before timeouts.idle");
}

/// The drain is an event: an idle keep-alive connection closes at once (timeouts.idle is
/// 60 s here), accepting stops, and the server returns.
#[tokio::test]
async fn the_drain_closes_idle_connections_and_ends_accepting() {
    let running = start(Bytes::from_static(b"ok"), |_| {}).await;
    let mut conn = TcpStream::connect(running.addr).await.unwrap();
    conn.write_all(GET).await.unwrap();
    read_response(&mut conn, 2).await;
    running.drain.signal();
    assert!(closed_within(&mut conn, BOUND).await, "asked to close by the drain");
    tokio::time::timeout(BOUND, running.served).await.unwrap().unwrap();
    assert!(TcpStream::connect(running.addr).await.is_err(), "the listener is gone");
}

/// A caller that stops reading loses its connection after timeouts.write (the socket's
/// write-stall guard, the same for every role); one that reads gets every byte.
#[tokio::test]
async fn a_caller_that_stops_reading_is_cut_off_after_timeouts_write() {
    // Well past what loopback socket buffers hold, so the server's writes stall.
    let body = Bytes::from(vec![b'x'; 32 << 20]);
    let running = start(body.clone(), |c| c.timeouts.write = Duration::from_millis(200)).await;
    let mut stalled = TcpStream::connect(running.addr).await.unwrap();
    stalled.write_all(GET).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut received = 0usize;
    let mut chunk = vec![0u8; 1 << 20];
    let ended = loop {
        match tokio::time::timeout(BOUND, stalled.read(&mut chunk)).await {
            Err(_) => break false,
            Ok(Ok(0) | Err(_)) => break true,
            Ok(Ok(n)) => received += n,
        }
    };
    assert!(ended, "the connection was closed");
    assert!(received < body.len(), "cut off before the end ({received} bytes)");

    let mut reader = TcpStream::connect(running.addr).await.unwrap();
    reader.write_all(GET).await.unwrap();
    let response = read_response(&mut reader, body.len()).await;
    assert!(response.starts_with("HTTP/1.1 200"));
}

/// hyper's own error heads (a request it cannot parse) carry the role's level.
#[tokio::test]
async fn hypers_own_error_heads_carry_the_roles_level() {
    let running = start(Bytes::from_static(b"ok"), |_| {}).await;
    let mut conn = TcpStream::connect(running.addr).await.unwrap();
    conn.write_all(b"GET / HTTP/1.1\r\nbad header\r\n\r\n").await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(BOUND, conn.read_to_end(&mut buf)).await;
    let response = String::from_utf8_lossy(&buf).to_ascii_lowercase();
    assert!(response.starts_with("http/1.1 400"), "{response}");
    assert!(response.contains("x-admission-level: 1.2\r\n"), "{response}");
}

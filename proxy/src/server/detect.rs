//! HTTP/1.1 or h2c prior knowledge, decided on the first byte that differs from the h2
//! preface (so `GET / HTTP/1.0\r\n\r\n`, 18 bytes, is HTTP/1.1 at its first byte), by
//! peeking: the bytes stay in the socket for the server that reads them.

use std::io;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;

pub const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// While what arrived is a strict prefix of the preface, how long to wait before looking
/// again (real h2 clients send the preface in one piece; this is for the odd split one).
const PARTIAL_RETRY: Duration = Duration::from_millis(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detected {
    Http1,
    H2,
}

/// The caller's protocol, or `None` if it closed or sent nothing decisive by `deadline`.
pub async fn protocol(stream: &TcpStream, deadline: Instant) -> io::Result<Option<Detected>> {
    let mut buf = [0u8; 24];
    loop {
        let Ok(peeked) = tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await else {
            return Ok(None);
        };
        let n = peeked?;
        if n == 0 {
            return Ok(None);
        }
        if let Some(detected) = decide(&buf[..n]) {
            return Ok(Some(detected));
        }
        if tokio::time::timeout_at(deadline, tokio::time::sleep(PARTIAL_RETRY)).await.is_err() {
            return Ok(None);
        }
    }
}

/// The verdict on the first bytes, or `None` while they are a strict prefix of the preface.
/// Bytes past the preface do not matter (the listener peeks at most the preface's 24).
pub fn decide(first: &[u8]) -> Option<Detected> {
    let first = &first[..first.len().min(H2_PREFACE.len())];
    if first != &H2_PREFACE[..first.len()] {
        return Some(Detected::Http1);
    }
    (first.len() == H2_PREFACE.len()).then_some(Detected::H2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decides_on_the_first_differing_byte() {
        assert_eq!(decide(b"G"), Some(Detected::Http1));
        assert_eq!(decide(b"GET / HTTP/1.0\r\n\r\n"), Some(Detected::Http1));
        assert_eq!(decide(b"PRI * HTTP/1.1"), Some(Detected::Http1));
        assert_eq!(decide(b"PRI * HTTP/2"), None);
        assert_eq!(decide(H2_PREFACE), Some(Detected::H2));
    }

    /// Fuzz finding (fuzz/fuzz_targets/detect.rs): more than the preface's 24 bytes sliced
    /// the preface past its end and panicked. The listener's 24-byte peek never did that.
    #[test]
    fn bytes_past_the_preface_do_not_matter() {
        let mut h2 = H2_PREFACE.to_vec();
        h2.extend_from_slice(b"\0\0\x12\x04");
        assert_eq!(decide(&h2), Some(Detected::H2));
        assert_eq!(decide(b"GET /a/long/path HTTP/1.1\r\nhost: x\r\n\r\n"), Some(Detected::Http1));
    }
}

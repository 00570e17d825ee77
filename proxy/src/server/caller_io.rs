//! The caller's socket as hyper sees it, with three additions:
//!
//! - **write timeout**: a write that makes no progress for `timeouts.write` (the caller
//!   stopped reading, the socket buffer is full) fails, which ends the connection;
//! - **one `Content-Length`** (HTTP/1.1): hyper refuses `Content-Length: 5,5` (one line,
//!   a list of equal values) with a 400; RFC 9110 lets a recipient replace it with the single
//!   value, which is what a proxy in front of an app should do. In a request head read right
//!   after the previous response, the repeated values are blanked out (`5  `; the value's
//!   trailing whitespace is not part of it). Unequal values are left for hyper to refuse;
//! - **level on hyper's own errors** (HTTP/1.1 only): hyper answers a request it cannot
//!   parse with a canned `400` (or `414`, `431`, `505`) written straight to the socket, past
//!   any service. Every weir response carries `x-admission-level`, so an error head without
//!   it is one of those, and the role's level ([`LevelStamp`]) is added to it on the way out.

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use super::activity::Activity;
use super::LevelStamp;

pub struct CallerIo {
    inner: TcpStream,
    write_timeout: Duration,
    stall: Option<Pin<Box<Sleep>>>,
    /// A write completed since the stall timer was last armed.
    progressed: bool,
    /// HTTP/1.1: where the level comes from.
    stamp: Option<Arc<dyn LevelStamp>>,
    /// A rewritten error head still to be written (already reported as written to hyper).
    pending: Option<Bytes>,
    /// HTTP/1.1: tells when a request head is expected, and when a write is blocked (the
    /// wait for the next head starts once the previous response is written).
    conn: Option<Arc<Activity>>,
    /// A write returned `Pending` and none has completed since (told to `conn`).
    blocked: bool,
}

impl CallerIo {
    pub fn http1(
        inner: TcpStream,
        write_timeout: Duration,
        stamp: Arc<dyn LevelStamp>,
        conn: Arc<Activity>,
    ) -> Self {
        CallerIo { stamp: Some(stamp), conn: Some(conn), ..Self::h2(inner, write_timeout) }
    }

    pub fn h2(inner: TcpStream, write_timeout: Duration) -> Self {
        CallerIo {
            inner,
            write_timeout,
            stall: None,
            progressed: false,
            stamp: None,
            pending: None,
            conn: None,
            blocked: false,
        }
    }

    /// Called when a write returned `Pending`: fails once no write has progressed for the
    /// write timeout.
    fn poll_stall(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let deadline = Instant::now() + self.write_timeout;
        let timer = match self.stall.as_mut() {
            None => self.stall.insert(Box::pin(tokio::time::sleep_until(deadline))),
            Some(timer) => {
                if self.progressed {
                    timer.as_mut().reset(deadline);
                }
                timer
            }
        };
        self.progressed = false;
        if timer.as_mut().poll(cx).is_ready() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "caller read nothing for longer than timeouts.write",
            ));
        }
        Ok(())
    }

    fn written<T>(
        &mut self,
        result: Poll<io::Result<T>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<T>> {
        match result {
            Poll::Ready(r) => {
                self.progressed = true;
                if std::mem::take(&mut self.blocked) {
                    if let Some(conn) = &self.conn {
                        conn.set_write_blocked(false);
                    }
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                if !std::mem::replace(&mut self.blocked, true) {
                    if let Some(conn) = &self.conn {
                        conn.set_write_blocked(true);
                    }
                }
                self.poll_stall(cx)?;
                Poll::Pending
            }
        }
    }

    /// Writes out a rewritten error head first.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some(mut pending) = self.pending.take() {
            let result = Pin::new(&mut self.inner).poll_write(cx, &pending);
            let n = match self.written(result, cx) {
                Poll::Ready(Ok(n)) => n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    self.pending = Some(pending);
                    return Poll::Pending;
                }
            };
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            pending.advance(n);
            if !pending.is_empty() {
                self.pending = Some(pending);
            }
        }
        Poll::Ready(Ok(()))
    }

    /// If `buf` is a whole error head without the level, the head with it.
    fn stamped(&self, buf: &[u8]) -> Option<Bytes> {
        let stamp = self.stamp.as_ref()?;
        // "HTTP/1.1 400 ...": one of the statuses hyper answers parse errors with, and the
        // whole head in this one buffer.
        if buf.len() < 16 || !buf.starts_with(b"HTTP/1.") {
            return None;
        }
        if !matches!(&buf[9..13], b"400 " | b"414 " | b"431 " | b"505 ") {
            return None;
        }
        let head_end = find(buf, b"\r\n\r\n")? + 4;
        let (name, value) = stamp.level_header();
        let mut line = Vec::with_capacity(name.as_str().len() + value.len() + 6);
        line.extend_from_slice(b"\r\n");
        line.extend_from_slice(name.as_str().as_bytes());
        line.extend_from_slice(b": ");
        if find(&buf[..head_end], &line[..line.len() - 2]).is_some() {
            return None;
        }
        line.extend_from_slice(value.as_bytes());
        let status_end = find(buf, b"\r\n")?;
        let mut head = Vec::with_capacity(head_end + line.len());
        head.extend_from_slice(&buf[..status_end]);
        head.extend_from_slice(&line);
        head.extend_from_slice(&buf[status_end..head_end]);
        Some(head.into())
    }
}

/// In the request head at the start of `read`, a `Content-Length` whose value is a list of
/// equal numbers keeps the first; the rest is blanked to trailing whitespace. The value must
/// be digits, commas and optional whitespace (space, tab) only, as RFC 9110's list syntax
/// says, so no line break or other byte hyper would refuse is ever blanked away.
pub fn collapse_content_length(read: &mut [u8]) {
    const NAME: &[u8] = b"content-length:";
    // No comma anywhere read: nothing to collapse (the common case, one memchr).
    if !read.contains(&b',') {
        return;
    }
    let head_end = head_end(read);
    let head = &mut read[..head_end];
    if !head.contains(&b',') {
        return;
    }
    let mut line_start = 0;
    while line_start < head.len() {
        let line_end = find(&head[line_start..], b"\r\n").map_or(head.len(), |i| line_start + i);
        let line = &mut head[line_start..line_end];
        if line.len() > NAME.len() && line[..NAME.len()].eq_ignore_ascii_case(NAME) {
            let value = &mut line[NAME.len()..];
            let mut parts = value.split(|&b| b == b',').map(trim_ows);
            let first = parts.next().unwrap_or_default();
            let all_equal = !first.is_empty()
                && first.iter().all(u8::is_ascii_digit)
                && parts.all(|p| p == first);
            if all_equal {
                if let Some(comma) = value.iter().position(|&b| b == b',') {
                    value[comma..].fill(b' ');
                }
            }
        }
        line_start = line_end + 2;
    }
}

/// Where a request head ends: after its first empty line. httparse, and so hyper, also ends
/// a line with a bare `\n`, so `\n\n` and `\n\r\n` both end it; without either, the whole
/// read is head so far.
fn head_end(read: &[u8]) -> usize {
    let lf_lf = find(read, b"\n\n").map(|i| i + 2);
    let lf_crlf = find(read, b"\n\r\n").map(|i| i + 3);
    lf_lf.into_iter().chain(lf_crlf).min().unwrap_or(read.len())
}

/// RFC 9110's optional whitespace (space and tab) trimmed from both ends.
fn trim_ows(mut value: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = value {
        value = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = value {
        value = rest;
    }
    value
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

impl AsyncRead for CallerIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let start = buf.filled().len();
        ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        if buf.filled().len() > start && self.conn.as_ref().is_some_and(|c| c.take_expect_head()) {
            collapse_content_length(&mut buf.filled_mut()[start..]);
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for CallerIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.poll_pending(cx))?;
        if let Some(head) = this.stamped(buf) {
            let consumed = find(buf, b"\r\n\r\n").map_or(buf.len(), |i| i + 4);
            this.pending = Some(head);
            return Poll::Ready(Ok(consumed));
        }
        let result = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.written(result, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.poll_pending(cx))?;
        if let Some(first) = bufs.iter().find(|b| !b.is_empty()) {
            if let Some(head) = this.stamped(first) {
                let consumed = find(first, b"\r\n\r\n").map_or(first.len(), |i| i + 4);
                this.pending = Some(head);
                return Poll::Ready(Ok(consumed));
            }
        }
        let result = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.written(result, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::collapse_content_length;

    fn collapsed(head: &str) -> String {
        let mut bytes = head.as_bytes().to_vec();
        collapse_content_length(&mut bytes);
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn equal_content_lengths_collapse_to_one() {
        assert_eq!(
            collapsed("POST / HTTP/1.1\r\nContent-Length: 5,5\r\n\r\nhe,lo"),
            "POST / HTTP/1.1\r\nContent-Length: 5  \r\n\r\nhe,lo"
        );
        assert_eq!(
            collapsed("P / HTTP/1.1\r\ncontent-length:7 , 7,7\r\n\r\n"),
            "P / HTTP/1.1\r\ncontent-length:7      \r\n\r\n"
        );
    }

    #[test]
    fn anything_else_is_left_for_hyper() {
        for head in [
            "POST / HTTP/1.1\r\nContent-Length: 5,6\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: ,5\r\n\r\n",
            "POST / HTTP/1.1\r\nx-list: 5,5\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n5,5",
        ] {
            assert_eq!(collapsed(head), head);
        }
    }

    /// Fuzz findings (fuzz/fuzz_targets/content_length.rs): a head hyper ends with a bare
    /// `\n` (`\r\n\n`) was scanned on into the body, whose bytes were rewritten; and a value
    /// whose parts were "equal" once `\r`, `\n` or a form feed was trimmed lost those bytes,
    /// turning a head hyper refuses into one it accepts.
    #[test]
    fn only_the_head_and_only_list_syntax_is_rewritten() {
        for head in [
            "POST / HTTP/1.1\r\nContent-Length: 22\r\n\r\ncontent-length: 7,7\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 22\r\n\ncontent-length: 7,7\r\n\r\n",
            "POST / HTTP/1.1\nContent-Length: 22\n\r\ncontent-length: 7,7\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 7,\r7\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 7,\n7\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 7,\x0c7\r\n\r\n",
        ] {
            assert_eq!(collapsed(head), head);
        }
        assert_eq!(
            collapsed("POST / HTTP/1.1\r\nContent-Length:\t7 ,\t7\t\r\n\r\n"),
            "POST / HTTP/1.1\r\nContent-Length:\t7     \r\n\r\n"
        );
    }
}

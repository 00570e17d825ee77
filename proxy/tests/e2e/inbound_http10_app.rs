//! An app that speaks HTTP/1.0 (answers `HTTP/1.0`, closes after each response, with or
//! without a content-length) must not cost HTTP/1.1 callers their keep-alive: weir ends
//! the app's connection, not the caller's, and answers the caller in HTTP/1.1.

use crate::support;

use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// An HTTP/1.0 app: reads one request head, answers it in HTTP/1.0 and closes.
async fn http10_app(with_length: bool) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut s = BufReader::new(s);
                let mut line = String::new();
                while s.read_line(&mut line).await.unwrap_or(0) > 0 && !line.ends_with("\r\n\r\n") {
                }
                let head = if with_length {
                    "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\n"
                } else {
                    "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n"
                };
                let _ = s.get_mut().write_all(format!("{head}hello").as_bytes()).await;
                let _ = s.get_mut().shutdown().await;
            });
        }
    });
    addr
}

/// Reads one response from `s`: (status line, lower-cased head, body).
async fn read_response(s: &mut BufReader<TcpStream>) -> (String, String, String) {
    let mut status = String::new();
    s.read_line(&mut status).await.unwrap();
    let mut head = String::new();
    let mut length = None;
    let mut chunked = false;
    loop {
        let mut line = String::new();
        s.read_line(&mut line).await.unwrap();
        if line == "\r\n" || line.is_empty() {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse::<usize>().ok();
        }
        chunked |= lower.starts_with("transfer-encoding:") && lower.contains("chunked");
        head.push_str(&lower);
    }
    let mut body = Vec::new();
    if let Some(n) = length {
        body.resize(n, 0);
        s.read_exact(&mut body).await.unwrap();
    } else if chunked {
        loop {
            let mut size = String::new();
            s.read_line(&mut size).await.unwrap();
            let n = usize::from_str_radix(size.trim(), 16).unwrap();
            let mut chunk = vec![0; n + 2];
            s.read_exact(&mut chunk).await.unwrap();
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else {
        panic!("a response without length or chunking ends the connection:\n{status}{head}");
    }
    (status.trim_end().to_string(), head, String::from_utf8(body).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http11_callers_keep_alive_when_the_app_speaks_http10() {
    for with_length in [true, false] {
        let app = http10_app(with_length).await;
        let weir = support::sidecar(app, |_| {});
        let conn = TcpStream::connect(weir.inbound_addr()).await.unwrap();
        let mut conn = BufReader::new(conn);
        for i in 0..3 {
            conn.get_mut()
                .write_all(b"GET /x HTTP/1.1\r\nHost: app\r\nUser-Agent: test\r\n\r\n")
                .await
                .unwrap();
            let (status, head, body) =
                tokio::time::timeout(Duration::from_secs(10), read_response(&mut conn))
                    .await
                    .unwrap_or_else(|_| panic!("request {i} (length {with_length}): no answer"));
            assert_eq!(status, "HTTP/1.1 200 OK", "request {i} (length {with_length}): {head}");
            assert_eq!(body, "hello");
            assert!(
                !head.contains("connection: close"),
                "request {i} (length {with_length}): {head}"
            );
            assert!(!head.contains("keep-alive"), "hop-by-hop header leaked: {head}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http10_caller_still_gets_an_http10_answer_and_a_close() {
    let app = http10_app(true).await;
    let weir = support::sidecar(app, |_| {});
    let mut conn = TcpStream::connect(weir.inbound_addr()).await.unwrap();
    conn.write_all(b"GET /x HTTP/1.0\r\nHost: app\r\n\r\n").await.unwrap();
    let mut all = String::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_string(&mut all))
        .await
        .expect("weir closes an HTTP/1.0 caller's connection after the answer")
        .unwrap();
    assert!(all.starts_with("HTTP/1.0 200 OK\r\n"), "{all}");
    assert!(all.ends_with("\r\n\r\nhello"), "{all}");
}

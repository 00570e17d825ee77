use super::*;

use std::convert::Infallible;

use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

const VERSIONS: [Version; 4] =
    [Version::HTTP_09, Version::HTTP_10, Version::HTTP_11, Version::HTTP_2];
const SPEAKS: [Speaks; 3] = [Speaks::Unknown, Speaks::H2c, Speaks::Http1Only];
const CONFIGURED: [AppProtocol; 3] = [AppProtocol::Auto, AppProtocol::Http1, AppProtocol::H2c];

/// Every combination (the domain is finite): the properties the module promises.
#[test]
fn the_choice_keeps_its_promises_in_every_case() {
    for configured in CONFIGURED {
        for caller in VERSIONS {
            for grpc in [false, true] {
                for speaks in SPEAKS {
                    let choice = decide(configured, caller, grpc, speaks);
                    let case = format!("{configured:?} {caller:?} grpc={grpc} {speaks:?}");
                    match configured {
                        AppProtocol::Http1 => {
                            assert_eq!(choice, Choice::Send(Protocol::Http1), "{case}")
                        }
                        AppProtocol::H2c => {
                            assert_eq!(choice, Choice::Send(Protocol::H2c), "{case}")
                        }
                        AppProtocol::Auto => {
                            if caller < Version::HTTP_2 {
                                assert_eq!(choice, Choice::Send(Protocol::Http1), "{case}");
                            }
                            // Never h2c to an upstream that was found not to speak it.
                            if speaks == Speaks::Http1Only {
                                assert_ne!(choice, Choice::Send(Protocol::H2c), "{case}");
                            }
                            // Never native gRPC over HTTP/1.1.
                            if grpc && caller == Version::HTTP_2 {
                                assert_ne!(choice, Choice::Send(Protocol::Http1), "{case}");
                            }
                            // The error only where nothing else can work.
                            if choice == Choice::GrpcNeedsH2 {
                                assert!(grpc && speaks == Speaks::Http1Only, "{case}");
                            }
                            // An h2c upstream gets HTTP/2 callers over h2c.
                            if speaks == Speaks::H2c && caller == Version::HTTP_2 {
                                assert_eq!(choice, Choice::Send(Protocol::H2c), "{case}");
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn native_grpc_is_told_from_grpc_web() {
    let with = |ct: &str| {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
        is_native_grpc(&h)
    };
    assert!(with("application/grpc"));
    assert!(with("application/grpc+proto"));
    assert!(with("application/grpc;charset=utf-8"));
    assert!(!with("application/grpc-web"));
    assert!(!with("application/grpc-web-text+proto"));
    assert!(!with("application/json"));
    assert!(!is_native_grpc(&HeaderMap::new()));
}

#[test]
fn the_grpc_error_is_trailers_only_unimplemented_and_says_why() {
    let (status, headers) = grpc_needs_h2_head();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["grpc-status"], "12");
    assert_eq!(headers[CONTENT_TYPE], "application/grpc");
    assert!(headers["grpc-message"].to_str().unwrap().contains("HTTP/1.1"));
}

// === probes against real servers ===

#[derive(Clone, Copy)]
enum Server {
    Http1,
    H2,
    Auto,
    /// Accepts and closes at once.
    Closes,
    /// Accepts and never answers.
    Silent,
}

/// A server of that kind on an ephemeral port, and how many connections it accepted.
async fn server(kind: Server) -> (SocketAddr, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicU64::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            count.fetch_add(1, Relaxed);
            let service = hyper::service::service_fn(|_req| async {
                Ok::<_, Infallible>(http::Response::new(Full::new(bytes::Bytes::from_static(
                    b"ok",
                ))))
            });
            let io = TokioIo::new(stream);
            match kind {
                Server::Http1 => {
                    tokio::spawn(
                        hyper::server::conn::http1::Builder::new().serve_connection(io, service),
                    );
                }
                Server::H2 => {
                    tokio::spawn(
                        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .serve_connection(io, service),
                    );
                }
                Server::Auto => {
                    tokio::spawn(async move {
                        let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                            .serve_connection(io, service)
                            .await;
                    });
                }
                Server::Closes => drop(io),
                Server::Silent => held.push(io),
            }
        }
    });
    (addr, accepted)
}

fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

#[tokio::test]
async fn probes_tell_h2c_from_http1_and_conclude_nothing_from_silence() {
    let timeout = Duration::from_millis(300);
    for (kind, expected) in [
        (Server::Http1, Speaks::Http1Only),
        (Server::H2, Speaks::H2c),
        (Server::Auto, Speaks::H2c),
        (Server::Closes, Speaks::Http1Only),
    ] {
        let (addr, _) = server(kind).await;
        assert_eq!(probe(addr, timeout).await, ProbeResult::Speaks(expected), "{expected:?}");
    }
    let (silent, _) = server(Server::Silent).await;
    let started = Instant::now();
    assert!(matches!(probe(silent, timeout).await, ProbeResult::Inconclusive(_)));
    assert!(started.elapsed() < timeout * 3, "bounded by the timeout: {:?}", started.elapsed());
    assert!(matches!(probe(closed_port(), timeout).await, ProbeResult::Inconclusive(_)));
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

#[tokio::test]
async fn the_first_h2_request_learns_and_the_rest_reuse_the_verdict() {
    let (addr, accepted) = server(Server::Http1).await;
    let upstream = Upstream::new(addr, Duration::from_millis(500));
    let h = HeaderMap::new();
    // HTTP/1.1 callers never probe.
    let choice =
        upstream.choose(AppProtocol::Auto, Version::HTTP_11, &h, Instant::now(), far()).await.0;
    assert_eq!(choice, Choice::Send(Protocol::Http1));
    assert_eq!(accepted.load(Relaxed), 0);
    // Many HTTP/2 requests at once: one probe, all get HTTP/1.1.
    let choices = futures_join((0..20).map(|_| {
        let u = upstream.clone();
        async move {
            u.choose(AppProtocol::Auto, Version::HTTP_2, &HeaderMap::new(), Instant::now(), far())
                .await
                .0
        }
    }))
    .await;
    assert!(choices.iter().all(|c| *c == Choice::Send(Protocol::Http1)), "{choices:?}");
    assert_eq!(accepted.load(Relaxed), 1, "one probe");
    assert_eq!(upstream.speaks(), Speaks::Http1Only);
    let mut grpc = HeaderMap::new();
    grpc.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    let choice =
        upstream.choose(AppProtocol::Auto, Version::HTTP_2, &grpc, Instant::now(), far()).await.0;
    assert_eq!(choice, Choice::GrpcNeedsH2);
    assert_eq!(accepted.load(Relaxed), 1, "still one probe");
}

#[tokio::test]
async fn a_suspect_verdict_is_rechecked_in_the_background() {
    let (h2, accepted) = server(Server::H2).await;
    let upstream = Upstream::new(h2, Duration::from_millis(500));
    let h = HeaderMap::new();
    assert_eq!(
        upstream.choose(AppProtocol::Auto, Version::HTTP_2, &h, Instant::now(), far()).await.0,
        Choice::Send(Protocol::H2c)
    );
    // Not before the backoff since the last probe...
    upstream.suspect();
    let _ = upstream.choose(AppProtocol::Auto, Version::HTTP_2, &h, Instant::now(), far()).await.0;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(accepted.load(Relaxed), 1);
    // ...then once, in the background, while the verdict keeps serving.
    tokio::time::sleep(SUSPECT_BACKOFF).await;
    upstream.suspect();
    assert_eq!(
        upstream.choose(AppProtocol::Auto, Version::HTTP_2, &h, Instant::now(), far()).await.0,
        Choice::Send(Protocol::H2c)
    );
    let deadline = Instant::now() + Duration::from_secs(2);
    while accepted.load(Relaxed) < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(accepted.load(Relaxed), 2, "re-checked once");
}

#[tokio::test]
async fn an_unreachable_upstream_is_not_probed_for_every_request() {
    let upstream = Upstream::new(closed_port(), Duration::from_millis(200));
    let h = HeaderMap::new();
    let started = Instant::now();
    for _ in 0..50 {
        let c =
            upstream.choose(AppProtocol::Auto, Version::HTTP_2, &h, Instant::now(), far()).await.0;
        assert_eq!(c, Choice::Send(Protocol::Http1), "nothing known: HTTP/1.1");
    }
    assert_eq!(upstream.speaks(), Speaks::Unknown);
    assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
}

#[tokio::test]
async fn a_request_never_waits_for_a_probe_past_its_deadline() {
    let (silent, _) = server(Server::Silent).await;
    let upstream = Upstream::new(silent, Duration::from_secs(5));
    let started = Instant::now();
    let deadline = started + Duration::from_millis(100);
    let c = upstream
        .choose(AppProtocol::Auto, Version::HTTP_2, &HeaderMap::new(), Instant::now(), deadline)
        .await
        .0;
    assert_eq!(c, Choice::Send(Protocol::Http1));
    assert!(started.elapsed() < Duration::from_millis(600), "{:?}", started.elapsed());
}

#[test]
fn upstreams_are_remembered_up_to_the_bound() {
    let ups = Upstreams::new(Duration::from_secs(1), 2);
    let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let first = ups.get(a);
    assert!(Arc::ptr_eq(&first.inner, &ups.get(a).inner), "the same memory for one address");
    for port in 2..10 {
        ups.get(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    assert!(ups.known.lock().unwrap().len() <= 2);
}

async fn futures_join<F: std::future::Future + Send + 'static>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

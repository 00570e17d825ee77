//! gRPC through weir with a real tonic server and client: calls and their trailers pass
//! through; weir's refusals reach the client as RESOURCE_EXHAUSTED with a retry pushback.

use crate::support;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use support::grpc_codec::RawCodec;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::server::{NamedService, UnaryService};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

// === the app: weir.test.Echo/Echo ===

#[derive(Clone)]
struct Echo {
    hold: Arc<tokio::sync::Semaphore>,
}

impl NamedService for Echo {
    const NAME: &'static str = "weir.test.Echo";
}

impl tonic::codegen::Service<http::Request<tonic::body::Body>> for Echo {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let echo = self.clone();
        Box::pin(async move {
            if req.uri().path() != "/weir.test.Echo/Echo" {
                return Ok(Status::unimplemented("no such method").into_http());
            }
            let mut grpc = tonic::server::Grpc::new(RawCodec);
            Ok(grpc.unary(echo, req).await)
        })
    }
}

impl UnaryService<Bytes> for Echo {
    type Response = Bytes;
    type Future = BoxFuture<Result<Response<Bytes>, Status>>;

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        let hold = self.hold.clone();
        Box::pin(async move {
            let payload = request.into_inner();
            match &payload[..] {
                b"fail" => Err(Status::not_found("the app says: no such thing")),
                b"hold" => {
                    if let Ok(p) = hold.acquire().await {
                        p.forget();
                    }
                    Ok(Response::new(payload))
                }
                _ => Ok(Response::new(payload)),
            }
        })
    }
}

async fn grpc_app() -> (std::net::SocketAddr, Arc<tokio::sync::Semaphore>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hold = Arc::new(tokio::sync::Semaphore::new(0));
    let echo = Echo { hold: hold.clone() };
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(
        tonic::transport::Server::builder().add_service(echo).serve_with_incoming(incoming),
    );
    (addr, hold)
}

async fn call(channel: Channel, payload: &'static [u8]) -> Result<Response<Bytes>, Status> {
    let mut client = tonic::client::Grpc::new(channel);
    client.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
    let path = PathAndQuery::from_static("/weir.test.Echo/Echo");
    let mut req = Request::new(Bytes::from_static(payload));
    req.metadata_mut().insert("x-business-priority", "2".parse().unwrap());
    client.unary(req, path, RawCodec).await
}

fn channel(addr: std::net::SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}")).unwrap().connect_lazy()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_and_their_trailers_pass_through() {
    let (app, _hold) = grpc_app().await;
    let weir = support::sidecar(app, |_| {});
    let ch = channel(weir.inbound_addr());

    let ok = call(ch.clone(), b"hello").await.expect("call succeeds");
    assert_eq!(ok.get_ref(), &Bytes::from_static(b"hello"));
    assert_eq!(ok.metadata().get("x-admission-level").unwrap(), "255.127");

    // The app's own status travels in trailers and must arrive intact.
    let err = call(ch, b"fail").await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(err.message(), "the app says: no such thing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_reach_a_grpc_client_as_resource_exhausted() {
    let (app, hold) = grpc_app().await;
    let weir = support::sidecar(app, |c| {
        c.inbound.max_inflight = 1;
        c.inbound.max_queued = 0;
        c.inbound.retry_after = Duration::from_millis(750);
    });
    let ch = channel(weir.inbound_addr());
    let held = tokio::spawn(call(ch.clone(), b"hold"));
    assert!(support::eventually(Duration::from_secs(10), || weir.status().inflight == 1).await);

    let refused = call(ch.clone(), b"hello").await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(refused.metadata().get("grpc-retry-pushback-ms").unwrap(), "750");
    assert_eq!(refused.metadata().get("x-weir-shed").unwrap(), "overload");
    assert!(refused.metadata().get("x-admission-level").is_some());

    hold.add_permits(1);
    assert_eq!(held.await.unwrap().unwrap().get_ref(), &Bytes::from_static(b"hold"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_grpc_timeout_is_refused_trailers_only() {
    // tonic's client enforces grpc-timeout itself, so a spent budget is sent by hand over h2.
    let (app, _hold) = grpc_app().await;
    let weir = support::sidecar(app, |_| {});
    let url = format!("http://{}/weir.test.Echo/Echo", weir.inbound_addr());
    let headers =
        [("content-type", "application/grpc"), ("te", "trailers"), ("grpc-timeout", "0m")];
    let body = support::client::bytes_body(Bytes::from_static(b"\0\0\0\0\x04late"));
    let resp =
        support::client::H2::new().send(http::Method::POST, &url, &headers, body).await.unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("grpc-status"), Some("8"));
    assert_eq!(resp.header("x-weir-shed"), Some("deadline"));
    assert!(resp.header("grpc-retry-pushback-ms").is_some());
    assert!(resp.body.is_empty(), "trailers-only");
    resp.level();
}

//! A bare pingora reverse proxy with weir's server settings (one runtime per thread without
//! work stealing, h2c on the listener, keep-alive upstream) and nothing else: the baseline
//! weir's own per-request cost is measured against.
//!
//! `cargo run --release -p proxy --example bare_pingora -- LISTEN APP [THREADS]`

use std::net::SocketAddr;

use async_trait::async_trait;
use pingora::apps::HttpServerOptions;
use pingora::proxy::{ProxyHttp, ProxyServiceBuilder, Session};
use pingora::server::configuration::ServerConf;
use pingora::server::Server;
use pingora::upstreams::peer::HttpPeer;
use pingora::Result;

/// The same allocator as the `weir` binary, so the comparison is of the proxy logic.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

struct Bare {
    app: SocketAddr,
}

#[async_trait]
impl ProxyHttp for Bare {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.app, false, String::new())))
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let usage = "usage: bare_pingora LISTEN APP [THREADS]";
    let (Some(listen), Some(app)) = (args.next(), args.next()) else {
        eprintln!("{usage}");
        std::process::exit(64);
    };
    let Ok(app) = app.parse::<SocketAddr>() else {
        eprintln!("{usage}: APP must be an address");
        std::process::exit(64);
    };
    let threads = args.next().and_then(|t| t.parse().ok()).unwrap_or(1);
    let conf = ServerConf {
        threads,
        work_stealing: false,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut options = HttpServerOptions::default();
    options.h2c = true;
    let mut service = ProxyServiceBuilder::new(&server.configuration, Bare { app })
        .name("bare")
        .server_options(options)
        .build();
    service.add_tcp(&listen);
    server.add_service(service);
    server.run_forever();
}

//! Assembling the pingora server that runs the inbound listener.

use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::sync::Arc;

use http::HeaderName;
use pingora::apps::HttpServerOptions;
use pingora::protocols::http::v2::server::default_h2_options;
use pingora::proxy::ProxyServiceBuilder;
use pingora::server::configuration::ServerConf;
use pingora::server::Server;

use crate::config::SidecarConfig;
use crate::inbound::Inbound;
use crate::priority::PriorityHeaders;
use crate::refusal::Refusals;
use crate::shared::Shared;
use crate::sidecar::StartError;
use crate::telemetry::ProxyMetrics;
use crate::wire_name::WireName;

/// Checks the inbound address is free and resolves port 0 to a concrete free port. Pingora
/// binds by address string, so the port is released and re-bound by pingora a moment later.
pub(crate) fn reserve(addr: SocketAddr) -> Result<SocketAddr, StartError> {
    let listener = StdTcpListener::bind(addr).map_err(|source| StartError::Bind {
        what: "inbound.listen",
        addr,
        source,
    })?;
    listener.local_addr().map_err(|source| StartError::Bind {
        what: "inbound.listen",
        addr,
        source,
    })
}

pub(crate) fn build_server(
    config: &SidecarConfig,
    listen: SocketAddr,
    shared: Arc<Shared>,
    metrics: ProxyMetrics,
) -> Result<Server, StartError> {
    let inbound = &config.inbound;
    let conf = ServerConf {
        threads: inbound.worker_threads(),
        // One runtime per thread without work stealing measured ~10% faster here.
        work_stealing: inbound.work_stealing,
        // Pingora's own grace sleeps unconditionally (default 300 s). weir drains itself
        // (`Sidecar::run_until_signal`) and exits as soon as the last request is done; this
        // is only the upper bound.
        grace_period_seconds: Some(inbound.shutdown_grace.as_secs_f64().ceil() as u64),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let header = |s: &str| {
        HeaderName::from_bytes(s.as_bytes()).map_err(|e| StartError::Other(e.to_string()))
    };
    let names = &inbound.headers;
    let app = Inbound {
        shared,
        metrics,
        refusals: Refusals::new(header(&names.level)?, header(&names.shed)?, inbound.retry_after),
        priority: PriorityHeaders {
            business: header(&names.business)?,
            user: header(&names.user)?,
            forward_user_id: inbound.forward_user_id,
            default: inbound.default_priority(),
        },
        timeout_header: WireName::new(header(&names.timeout)?),
        entry: inbound.entry,
        task_timeout: inbound.task_timeout,
        overload_max_wait: inbound.overload_max_wait,
        app: inbound.app,
        app_protocol: inbound.app_protocol,
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut options = HttpServerOptions::default();
    options.h2c = true;
    let mut service = ProxyServiceBuilder::new(&server.configuration, app)
        .name("weir-inbound")
        .server_options(options)
        .build();
    // One h2 connection (a gRPC client's usual) must be able to hold every request weir may
    // queue or forward; at pingora's default of 100 streams, the client would queue the rest
    // itself, out of sight, and even instant refusals would wait behind them.
    let streams = (inbound.max_inflight + inbound.max_queued).clamp(100, u32::MAX as usize);
    let mut h2 = default_h2_options();
    h2.max_concurrent_streams(streams as u32);
    if let Some(proxy) = service.app_logic_mut() {
        proxy.h2_options = Some(h2);
    }
    service.add_tcp(&listen.to_string());
    server.add_service(service);
    Ok(server)
}

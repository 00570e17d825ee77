//! `weir inject`: flags and the process around [`crate::server`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::patch::Exclusions;
use crate::server::{Limits, Running};
use crate::template::Template;
use crate::tls::CertStore;

/// BSD `EX_USAGE`: a bad flag, certificate or template.
pub const EXIT_USAGE: u8 = 64;

#[derive(Debug, Clone, clap::Args)]
pub struct InjectArgs {
    /// HTTPS listen address (the chart sets 0.0.0.0:8443).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8443")]
    pub listen: SocketAddr,
    /// PEM certificate chain (tls.crt of the mounted Secret); re-read when it changes.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: PathBuf,
    /// PEM private key (tls.key of the mounted Secret); re-read when it changes.
    #[arg(long, value_name = "FILE")]
    pub tls_key: PathBuf,
    /// Directory holding the injector template (the chart's `<fullname>-injector-template`
    /// ConfigMap).
    #[arg(long, value_name = "DIR")]
    pub template_dir: PathBuf,
    /// Namespaces never injected (repeat the flag); kube-system, kube-public and
    /// kube-node-lease are always excluded.
    #[arg(long = "exclude-namespace", value_name = "NAMESPACE")]
    pub exclude_namespaces: Vec<String>,
    /// The injector's own namespace, never injected.
    #[arg(long, value_name = "NAMESPACE", env = "POD_NAMESPACE")]
    pub own_namespace: Option<String>,
    /// How often the certificate files are checked for a new pair.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration)]
    pub reload_every: Duration,
    /// Largest AdmissionReview accepted, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().max_body_bytes)]
    pub max_body_bytes: usize,
    /// Longest wait for a request head (after the handshake or the previous request).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration)]
    pub header_read_timeout: Duration,
    /// Longest wait for a whole request body.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration)]
    pub body_read_timeout: Duration,
    /// Longest TLS handshake, from accept (well under the API server's timeoutSeconds: a
    /// connection that says nothing gives its slot back before a review could time out).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = duration)]
    pub handshake_timeout: Duration,
    /// Connections served at once; more are closed on accept.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_connections)]
    pub max_connections: usize,
    /// Connections served at once from one peer address; more from it are closed on accept.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_connections_per_peer)]
    pub max_connections_per_peer: usize,
    /// On SIGTERM, how long to keep serving with /ready failing before the listener closes
    /// (endpoint removal reaching the API server takes a moment).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration_or_zero)]
    pub drain_delay: Duration,
}

fn duration_or_zero(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| e.to_string())
}

fn duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if d.is_zero() {
        return Err("must be greater than zero".into());
    }
    Ok(d)
}

/// Everything `weir inject` needs, checked; the error is one line naming the flag or file.
pub fn prepare(args: &InjectArgs) -> Result<(CertStore, Template, Exclusions, Limits), String> {
    let template =
        Template::from_dir(&args.template_dir).map_err(|e| format!("--template-dir: {e}"))?;
    let certs = CertStore::load(&args.tls_cert, &args.tls_key)
        .map_err(|e| format!("--tls-cert/--tls-key: {e}"))?;
    let mut exclusions =
        Exclusions::defaults(args.own_namespace.as_deref().filter(|n| !n.is_empty()));
    exclusions.namespaces.extend(args.exclude_namespaces.iter().cloned());
    if args.max_body_bytes < 1024 {
        return Err("--max-body-bytes: must be at least 1024".into());
    }
    if args.max_connections == 0 {
        return Err("--max-connections: must be at least 1".into());
    }
    if args.max_connections_per_peer == 0 || args.max_connections_per_peer > args.max_connections {
        return Err(format!(
            "--max-connections-per-peer: must be within 1..={} (--max-connections)",
            args.max_connections
        ));
    }
    let limits = Limits {
        max_body_bytes: args.max_body_bytes,
        handshake_timeout: args.handshake_timeout,
        header_read_timeout: args.header_read_timeout,
        body_read_timeout: args.body_read_timeout,
        max_connections: args.max_connections,
        max_connections_per_peer: args.max_connections_per_peer,
        ..Limits::default()
    };
    Ok((certs, template, exclusions, limits))
}

/// Runs the webhook until SIGTERM or SIGINT. Logging must already be set up.
pub fn run(args: InjectArgs) -> ExitCode {
    let (certs, template, exclusions, limits) = match prepare(&args) {
        Ok(p) => p,
        Err(line) => {
            eprintln!("weir: {line}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let runtime =
        match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("weir: cannot start the runtime: {e}");
                return ExitCode::FAILURE;
            }
        };
    runtime.block_on(async move {
        let placement = template.placement;
        let server = match Running::start(
            args.listen,
            certs,
            template,
            exclusions,
            limits,
            args.reload_every,
        )
        .await
        {
            Ok(s) => s,
            Err(e) => {
                eprintln!("weir: --listen {}: {e}", args.listen);
                return ExitCode::from(EXIT_USAGE);
            }
        };
        tracing::info!(addr = %server.addr, ?placement, "weir inject serving");
        wait_for_signal().await;
        tracing::info!(drain = ?args.drain_delay, "draining: /ready fails, reviews still served");
        server.begin_drain();
        tokio::select! {
            _ = tokio::time::sleep(args.drain_delay) => {}
            // A second signal stops at once.
            _ = wait_for_signal() => {}
        }
        tracing::info!("stopping");
        match server.shutdown().await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("weir: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

//! The injector's attack: `weir inject` (release, shipped limits) with a certificate made
//! here, the API server's reviews on fresh verified TLS connections (the case a full server
//! breaks), and 1,100 idle TCP connections from one host (the finding: they blocked
//! every review for 9 s). The TLS pieces mirror `inject/tests/support` (a test module, not
//! a library).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls_pki_types::{pem::PemObject, CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::{HardeningConfig, Run, Watch};

/// The name the certificate is for (what the chart's Service is called).
const SERVER_NAME: &str = "weir-injector.weir-system.svc";

/// A CA and a server certificate it signed, as PEM.
struct Pki {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

impl Pki {
    fn new() -> anyhow::Result<Pki> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "hardening-bench ca");
        let ca_key = KeyPair::generate()?;
        let ca_cert = ca.self_signed(&ca_key)?;
        let leaf = CertificateParams::new(vec![SERVER_NAME.to_string()])?;
        let leaf_key = KeyPair::generate()?;
        let leaf_cert = leaf.signed_by(&leaf_key, &ca_cert, &ca_key)?;
        Ok(Pki {
            ca_pem: ca_cert.pem(),
            cert_pem: leaf_cert.pem(),
            key_pem: leaf_key.serialize_pem(),
        })
    }
}

/// `weir inject` as a child, killed on drop.
struct Injector {
    child: Child,
    addr: SocketAddr,
}

impl Injector {
    async fn start(
        bin: &Path,
        workspace: &Path,
        dir: &Path,
        pki: &Pki,
    ) -> anyhow::Result<Injector> {
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert, &pki.cert_pem)?;
        std::fs::write(&key, &pki.key_pem)?;
        let log = dir.join("inject.log");
        let mut child = Command::new(bin)
            .arg("inject")
            .args(["--listen", "127.0.0.1:0", "--own-namespace", "weir-system"])
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key)
            .arg("--template-dir")
            .arg(workspace.join("inject/tests/fixtures/templates/native"))
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let addr = text
                .lines()
                .filter(|l| l.contains("weir inject serving"))
                .find_map(|l| l.split("addr=").nth(1)?.split_whitespace().next()?.parse().ok());
            if let Some(addr) = addr {
                return Ok(Injector { child, addr });
            }
            if let Some(status) = child.try_wait()? {
                anyhow::bail!("weir inject exited ({status}): {text}");
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                anyhow::bail!("weir inject did not say where it listens within 30 s: {text}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Injector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn connector(ca_pem: &str) -> anyhow::Result<TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}

/// One review on a fresh verified TLS connection: `Ok` when it is answered 200 with a patch.
async fn review(addr: SocketAddr, tls: &TlsConnector, body: Bytes) -> Result<(), String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let name = ServerName::try_from(SERVER_NAME).map_err(|e| e.to_string())?;
    let stream = tls.connect(name, tcp).await.map_err(|e| format!("handshake: {}", e.kind()))?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("http: {e}"))?;
    tokio::spawn(conn);
    let req = http::Request::post("/inject/namespace?timeout=5s")
        .header("host", SERVER_NAME)
        .header("content-type", "application/json")
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let resp = send.send_request(req).await.map_err(|e| format!("review: {e}"))?;
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    if status != 200 {
        return Err(format!("{status}"));
    }
    let json: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    if json["response"]["patchType"] != "JSONPatch" {
        return Err("no patch".into());
    }
    Ok(())
}

/// `n` TCP connections that never send a byte, from 127.0.0.`source`.
async fn idle_connections(addr: SocketAddr, n: usize, source: u8) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let Ok(socket) = tokio::net::TcpSocket::new_v4() else { continue };
        if socket.bind((std::net::Ipv4Addr::new(127, 0, 0, source), 0).into()).is_err() {
            continue;
        }
        if let Ok(stream) = socket.connect(addr).await {
            held.push(stream);
        }
    }
    held
}

pub(super) async fn idle_flood(c: &HardeningConfig) -> anyhow::Result<Run> {
    const IDLE: usize = 1_100;
    let dir = tempfile::tempdir()?;
    let pki = Pki::new()?;
    let injector = Injector::start(&c.weir_bin, &c.workspace, dir.path(), &pki).await?;
    let addr = injector.addr;
    let tls = connector(&pki.ca_pem)?;
    let body = Bytes::from(std::fs::read(
        c.workspace.join("inject/tests/fixtures/reviews/namespace__deployment-pod.json"),
    )?);
    let reviewer = move |_| {
        let (tls, body) = (tls.clone(), body.clone());
        async move { review(addr, &tls, body).await }
    };
    let pid = injector.child.id();
    let watch = Watch::unattacked(pid, c.phase, c.pace, reviewer.clone()).await;
    let started = Instant::now();
    let held = idle_connections(addr, IDLE, 2).await;
    let opened_in = started.elapsed();
    let attacked = watch.attacked(c.phase, c.pace, reviewer).await;
    let opened = held.len() as u64;
    drop(held);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let phases = attacked.after();
    let mut outcomes = BTreeMap::new();
    outcomes.insert("idle connections the kernel completed".into(), opened);
    Ok(Run {
        attack: super::AttackKind::InjectorFlood,
        what: format!("{IDLE} idle TCP connections from 127.0.0.2 to `weir inject`, held through the attacked phase"),
        settings: "`weir inject` with its shipped limits (1,024 connections, 64 per peer, 2 s handshake)".into(),
        caller: "the API server's review: fresh TLS connection (verified) + POST /inject/namespace, HTTP/1.1".into(),
        phases,
        attack_outcomes: outcomes,
        notes: vec![format!("the idle connections were opened in {:.2} s, at the start of the attacked phase", opened_in.as_secs_f64())],
    })
}

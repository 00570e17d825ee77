//! Test support: a CA and server certificates (rcgen), a verifying HTTPS client (rustls +
//! hyper), and a running injector on an ephemeral loopback port.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use weir_inject::patch::Exclusions;
use weir_inject::server::{Limits, Running};
use weir_inject::template::Template;
use weir_inject::tls::CertStore;

/// The name the API server dials: `<service>.<namespace>.svc`.
pub const SERVER_NAME: &str = "demo-weir-injector.weir-system.svc";

pub fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(manifest_dir().join("tests/fixtures/reviews").join(format!("{name}.json")))
        .expect("fixture")
}

pub fn template() -> Template {
    Template::from_dir(&manifest_dir().join("tests/fixtures/templates/native")).expect("template")
}

/// A CA and a server certificate it signed, as PEM.
pub struct Pki {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl Pki {
    pub fn new(ca_name: &str) -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, ca_name);
        let ca_key = KeyPair::generate().expect("ca key");
        let ca_cert = ca.self_signed(&ca_key).expect("ca cert");
        let leaf = CertificateParams::new(vec![SERVER_NAME.to_string()]).expect("leaf params");
        let leaf_key = KeyPair::generate().expect("leaf key");
        let leaf_cert = leaf.signed_by(&leaf_key, &ca_cert, &ca_key).expect("leaf cert");
        Pki { ca_pem: ca_cert.pem(), cert_pem: leaf_cert.pem(), key_pem: leaf_key.serialize_pem() }
    }
}

/// Certificate files laid out as the kubelet mounts a Secret: `tls.crt -> ..data/tls.crt`,
/// `..data -> ..<version>`; [`SecretDir::rotate`] swaps `..data` atomically.
pub struct SecretDir {
    pub dir: tempfile::TempDir,
    version: u32,
}

impl SecretDir {
    pub fn new(pki: &Pki) -> SecretDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = SecretDir { dir, version: 0 };
        s.rotate(&pki.cert_pem, &pki.key_pem);
        for f in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(format!("..data/{f}"), s.dir.path().join(f))
                .expect("symlink");
        }
        s
    }

    pub fn cert(&self) -> PathBuf {
        self.dir.path().join("tls.crt")
    }

    pub fn key(&self) -> PathBuf {
        self.dir.path().join("tls.key")
    }

    pub fn rotate(&mut self, cert_pem: &str, key_pem: &str) {
        self.version += 1;
        let root = self.dir.path();
        let versioned = root.join(format!("..v{}", self.version));
        std::fs::create_dir(&versioned).expect("version dir");
        std::fs::write(versioned.join("tls.crt"), cert_pem).expect("write crt");
        std::fs::write(versioned.join("tls.key"), key_pem).expect("write key");
        let tmp = root.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(versioned.file_name().unwrap(), &tmp).expect("symlink");
        std::fs::rename(&tmp, root.join("..data")).expect("swap ..data");
    }
}

pub fn test_limits() -> Limits {
    Limits {
        max_body_bytes: 256 * 1024,
        handshake_timeout: Duration::from_secs(2),
        header_read_timeout: Duration::from_millis(500),
        body_read_timeout: Duration::from_millis(500),
        max_connections: 256,
        max_connections_per_peer: weir_inject::server::DEFAULT_MAX_CONNECTIONS_PER_PEER,
        shutdown_grace: Duration::from_secs(2),
    }
}

pub async fn start(secret: &SecretDir, limits: Limits, reload_every: Duration) -> Running {
    let certs = CertStore::load(&secret.cert(), &secret.key()).expect("certs load");
    Running::start(
        "127.0.0.1:0".parse().unwrap(),
        certs,
        template(),
        Exclusions::defaults(Some("weir-system")),
        limits,
        reload_every,
    )
    .await
    .expect("server starts")
}

/// A TLS connector trusting only `ca_pem`, offering `alpn`.
pub fn connector(ca_pem: &str, alpn: &[&[u8]]) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.expect("ca pem")).expect("add root");
    }
    let mut config = rustls::ClientConfig::builder_with_provider(weir_inject::tls::provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    TlsConnector::from(Arc::new(config))
}

pub async fn tls_connect(
    addr: SocketAddr,
    ca_pem: &str,
    alpn: &[&[u8]],
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from(SERVER_NAME).unwrap();
    tokio::time::timeout(Duration::from_secs(5), connector(ca_pem, alpn).connect(name, tcp))
        .await
        .map_err(|_| std::io::Error::other("handshake timed out"))?
}

/// An HTTP/1.1 or HTTP/2 client connection over verified TLS.
pub enum Client {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

pub struct Reply {
    pub status: u16,
    pub body: serde_json::Value,
    pub text: String,
}

impl Client {
    pub async fn connect(addr: SocketAddr, ca_pem: &str, h2: bool) -> std::io::Result<Client> {
        let alpn: &[&[u8]] = if h2 { &[b"h2"] } else { &[b"http/1.1"] };
        let tls = tls_connect(addr, ca_pem, alpn).await?;
        let io = TokioIo::new(tls);
        if h2 {
            let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(std::io::Error::other)?;
            tokio::spawn(conn);
            Ok(Client::H2(send))
        } else {
            let (send, conn) =
                hyper::client::conn::http1::handshake(io).await.map_err(std::io::Error::other)?;
            tokio::spawn(conn);
            Ok(Client::H1(send))
        }
    }

    pub async fn request(&mut self, method: &str, path: &str, body: Vec<u8>) -> Reply {
        let req = http::Request::builder()
            .method(method)
            .uri(format!("https://{SERVER_NAME}{path}"))
            .header("content-type", "application/json")
            .header("host", SERVER_NAME)
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let send = async {
            match self {
                Client::H1(s) => {
                    s.ready().await?;
                    s.send_request(req).await
                }
                Client::H2(s) => {
                    s.ready().await?;
                    let mut req = req;
                    req.headers_mut().remove("host");
                    s.send_request(req).await
                }
            }
        };
        let resp = tokio::time::timeout(Duration::from_secs(10), send)
            .await
            .expect("reply in time")
            .expect("reply");
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        let text = String::from_utf8_lossy(&bytes).to_string();
        let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
        Reply { status, body, text }
    }
}

/// Polls `check` every 20 ms for at most `limit`.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn path_of(p: &Path) -> String {
    p.display().to_string()
}

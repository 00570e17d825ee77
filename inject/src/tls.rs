//! The serving certificate: read from PEM files (a mounted `kubernetes.io/tls` Secret) and
//! reloaded when they change, without a restart.
//!
//! The kubelet updates a mounted Secret by swapping a `..data` symlink, which inotify on the
//! file path does not reliably report, so the files are re-read every `interval` (two small
//! reads) and swapped in when their content changed and parses into a matching cert/key
//! pair. A bad or half-written pair is logged, counted and skipped: the old certificate keeps
//! serving until a good one appears. Each handshake reads the current pair through an
//! [`ArcSwap`], so rotation never blocks a handshake.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::metrics::Metrics;

/// A certificate problem, naming the file.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct TlsError {
    pub path: String,
    pub message: String,
}

/// The provider everywhere in the injector: ring (no cmake, no aws-lc build).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The current certificate, swapped atomically on reload.
#[derive(Debug)]
pub struct CertStore {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: ArcSwap<CertifiedKey>,
    /// The file contents `current` was loaded from (to notice changes cheaply).
    loaded_from: std::sync::Mutex<(Vec<u8>, Vec<u8>)>,
}

impl CertStore {
    /// Loads the pair; fails (naming the file) when it is unreadable or does not match.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Self, TlsError> {
        let (cert_pem, key_pem) = read_pair(cert_path, key_path)?;
        let key = certified_key(&cert_pem, &key_pem, cert_path, key_path)?;
        Ok(CertStore {
            cert_path: cert_path.into(),
            key_path: key_path.into(),
            current: ArcSwap::from_pointee(key),
            loaded_from: std::sync::Mutex::new((cert_pem, key_pem)),
        })
    }

    /// Re-reads the files. `Ok(true)`: a new pair is serving; `Ok(false)`: unchanged.
    pub fn reload(&self) -> Result<bool, TlsError> {
        match self.reload_once() {
            // The two files are read one after the other: a Secret update between the reads
            // gives a certificate and a key that do not match. Read once more before failing.
            Err(_) => self.reload_once(),
            done => done,
        }
    }

    fn reload_once(&self) -> Result<bool, TlsError> {
        let (cert_pem, key_pem) = read_pair(&self.cert_path, &self.key_path)?;
        let mut loaded = self.loaded_from.lock().unwrap_or_else(|p| p.into_inner());
        if loaded.0 == cert_pem && loaded.1 == key_pem {
            return Ok(false);
        }
        let key = certified_key(&cert_pem, &key_pem, &self.cert_path, &self.key_path)?;
        self.current.store(Arc::new(key));
        *loaded = (cert_pem, key_pem);
        Ok(true)
    }

    /// Polls the files every `interval` until the task is dropped.
    pub async fn watch(self: Arc<Self>, interval: Duration, metrics: Arc<Metrics>) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        let mut last_error: Option<String> = None;
        loop {
            ticker.tick().await;
            let store = self.clone();
            // File reads and PEM/key parsing are blocking work.
            let result = tokio::task::spawn_blocking(move || store.reload()).await;
            match result {
                Ok(Ok(true)) => {
                    metrics.tls_reloaded(true);
                    last_error = None;
                    tracing::info!(cert = %self.cert_path.display(), "serving a new certificate");
                }
                Ok(Ok(false)) => last_error = None,
                Ok(Err(e)) => {
                    metrics.tls_reloaded(false);
                    // Mid-swap reads fail transiently: log a problem once, not every tick.
                    let text = e.to_string();
                    if last_error.as_deref() != Some(&text) {
                        tracing::warn!(error = %text, "certificate not reloaded; the previous one keeps serving");
                    }
                    last_error = Some(text);
                }
                Err(e) => tracing::error!(error = %e, "certificate reload task failed"),
            }
        }
    }

    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.load_full()
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// A rustls server config serving `store`'s certificate, HTTP/2 and HTTP/1.1 by ALPN.
pub fn server_config(store: Arc<CertStore>) -> Result<rustls::ServerConfig, rustls::Error> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(store);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

fn read_pair(cert_path: &Path, key_path: &Path) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
    let read = |p: &Path| {
        std::fs::read(p).map_err(|e| TlsError {
            path: p.display().to_string(),
            message: format!("cannot read: {e}"),
        })
    };
    Ok((read(cert_path)?, read(key_path)?))
}

fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_path: &Path,
    key_path: &Path,
) -> Result<CertifiedKey, TlsError> {
    let cert_err = |message: String| TlsError { path: cert_path.display().to_string(), message };
    let key_err = |message: String| TlsError { path: key_path.display().to_string(), message };
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| cert_err(format!("not a PEM certificate chain: {e}")))?;
    if chain.is_empty() {
        return Err(cert_err("no CERTIFICATE block".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| key_err(format!("not a PEM private key: {e}")))?;
    CertifiedKey::from_der(chain, key, &provider()).map_err(|e| {
        key_err(format!("unusable with the certificate in {}: {e}", cert_path.display()))
    })
}

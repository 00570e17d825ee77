//! Why a sidecar could not start: [`StartError`], one type for every part that starts
//! (the config, the admin side, the inbound and egress listeners), so none of them needs
//! the sidecar that starts it.

use std::net::SocketAddr;

use admission_core::FieldError;

use crate::admin::AdminError;

/// Why the sidecar could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A setting, named by its field: `weir run` exits 64 with this one line.
    #[error("{0}")]
    Config(FieldError),
    /// A listener could not be bound; `what` names its setting.
    #[error("{what} {addr}: {source}")]
    Bind { what: &'static str, addr: SocketAddr, source: std::io::Error },
    #[error("{0}")]
    Other(String),
}

impl From<FieldError> for StartError {
    fn from(e: FieldError) -> Self {
        StartError::Config(e)
    }
}

impl From<AdminError> for StartError {
    fn from(e: AdminError) -> Self {
        match e {
            AdminError::Config(f) => StartError::Config(f),
            AdminError::Bind { what, addr, source } => StartError::Bind { what, addr, source },
            AdminError::Other(m) => StartError::Other(m),
        }
    }
}

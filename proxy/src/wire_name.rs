//! A configured header name in both forms pingora needs: the parsed [`HeaderName`] for
//! lookups, and the bytes `insert_header` takes as the on-the-wire name. Handing pingora a
//! `HeaderName` makes it copy the name into fresh bytes on every insert; a shared `Bytes`
//! clone is a reference count.

use bytes::Bytes;
use http::HeaderName;

#[derive(Debug, Clone)]
pub struct WireName {
    name: HeaderName,
    wire: Bytes,
}

impl WireName {
    pub fn new(name: HeaderName) -> Self {
        let wire = Bytes::copy_from_slice(name.as_str().as_bytes());
        WireName { name, wire }
    }

    pub fn name(&self) -> &HeaderName {
        &self.name
    }

    /// For `insert_header`.
    #[inline]
    pub fn wire(&self) -> Bytes {
        self.wire.clone()
    }
}

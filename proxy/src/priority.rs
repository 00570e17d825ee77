//! Where a request's priority comes from: its headers on an inner hop, or the priority table
//! and the user-id hash at the entry (which first removes whatever the client claimed).

use std::sync::OnceLock;
use std::time::Duration;

use admission_core::priority::{parse_business, parse_user, HeaderValueError, MAX_USER};
use admission_core::table::{CompiledTable, RequestView};
use admission_core::Priority;
use http::{HeaderMap, HeaderName, HeaderValue};
use pingora::http::RequestHeader;

use crate::telemetry::InvalidReason;

/// The priority header names and what an inner hop assumes when they are unusable.
#[derive(Debug, Clone)]
pub struct PriorityHeaders {
    pub business: HeaderName,
    pub user: HeaderName,
    /// Entry role: keep the user-id header on the forwarded request.
    pub forward_user_id: bool,
    /// Configured default; `None` means the table's least important business, user 127.
    pub default: Option<Priority>,
}

/// A priority read from headers, and why it fell back to a default if it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadPriority {
    pub priority: Priority,
    pub invalid: Option<InvalidReason>,
}

// === impl PriorityHeaders ===

impl PriorityHeaders {
    /// The default for unusable headers under `table`.
    pub fn default_priority(&self, table: &CompiledTable) -> Priority {
        self.default
            .unwrap_or(Priority { business: table.least_important_business(), user: MAX_USER })
    }

    /// Inner hop: the caller's headers. A bad business header means the whole default; a
    /// bad user header keeps the business level and takes the default user level.
    pub fn read(&self, headers: &HeaderMap, default: Priority) -> ReadPriority {
        let business = single(headers, &self.business).and_then(parse_business_header);
        let user = single(headers, &self.user).and_then(parse_user_header);
        match (business, user) {
            (Ok(business), Ok(user)) => {
                ReadPriority { priority: Priority { business, user }, invalid: None }
            }
            (Ok(business), Err(reason)) => ReadPriority {
                priority: Priority { business, user: default.user },
                invalid: Some(reason),
            },
            (Err(reason), _) => ReadPriority { priority: default, invalid: Some(reason) },
        }
    }

    /// Entry role: drop the client's priority headers and stamp the table's verdict.
    pub fn stamp(
        &self,
        req: &mut RequestHeader,
        table: &CompiledTable,
        unix: Duration,
    ) -> Priority {
        let business = table.classify(&View(req)).business;
        let user_header = table.user_header();
        let user = match req.headers.get(user_header) {
            Some(id) => table.user_hasher().user_priority(id.as_bytes(), unix),
            // Anonymous callers share the least important user level of their class.
            None => MAX_USER,
        };
        let _ = req.remove_header(&self.business);
        let _ = req.remove_header(&self.user);
        if !self.forward_user_id {
            let _ = req.remove_header(user_header);
        }
        let _ = req.insert_header(self.business.clone(), decimal(business));
        let _ = req.insert_header(self.user.clone(), decimal(user));
        Priority { business, user }
    }
}

fn single<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Result<&'a [u8], InvalidReason> {
    let mut values = headers.get_all(name).iter();
    let first = values.next().ok_or(InvalidReason::Missing)?;
    if values.next().is_some() {
        return Err(InvalidReason::Repeated);
    }
    Ok(first.as_bytes())
}

fn parse_business_header(v: &[u8]) -> Result<u8, InvalidReason> {
    parse_business(v).map_err(|e: HeaderValueError| e.into())
}

fn parse_user_header(v: &[u8]) -> Result<u8, InvalidReason> {
    parse_user(v).map_err(|e: HeaderValueError| e.into())
}

/// `0..=255` as header values, built once so stamping clones instead of formatting.
fn decimal(n: u8) -> HeaderValue {
    static VALUES: OnceLock<Box<[HeaderValue]>> = OnceLock::new();
    VALUES.get_or_init(|| (0..=255u16).map(HeaderValue::from).collect())[n as usize].clone()
}

// === impl View ===

/// The request as the priority table sees it.
struct View<'a>(&'a RequestHeader);

impl RequestView for View<'_> {
    fn method(&self) -> &str {
        self.0.method.as_str()
    }

    fn path(&self) -> &str {
        self.0.uri.path()
    }

    fn host(&self) -> Option<&str> {
        self.0
            .uri
            .host()
            .or_else(|| self.0.headers.get(http::header::HOST).and_then(|h| h.to_str().ok()))
    }

    fn header(&self, name: &str) -> Option<&[u8]> {
        self.0.headers.get(name).map(HeaderValue::as_bytes)
    }
}

#[cfg(test)]
mod tests;

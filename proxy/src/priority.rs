//! Where a request's priority comes from: its headers on an inner hop, or the priority table
//! and the user-id hash at the entry (which first removes whatever the client claimed).

use std::borrow::Cow;
use std::sync::OnceLock;
use std::time::Duration;

use admission_core::priority::{parse_business, parse_user, HeaderValueError, MAX_USER};
use admission_core::table::{normalize_path, CompiledTable, PathError, RequestView};
use admission_core::Priority;
use http::header::{CONTENT_LENGTH, HOST};
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri};

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

impl ReadPriority {
    /// What [`PriorityHeaders::read`] answers for a head without the business header (for a
    /// caller that already knows it is absent: no lookups).
    pub fn business_missing(default: Priority) -> Self {
        ReadPriority { priority: default, invalid: Some(InvalidReason::Missing) }
    }
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

    /// Entry role, on any HTTP stack: normalise the path, classify it, drop the client's
    /// priority headers and stamp the table's verdict.
    ///
    /// `Err` means the path is ambiguous (docs/design.md, "Normalised paths"): answer 400
    /// and forward nothing. `Ok(stamp)` with `stamp.rewrite` set means the forwarded
    /// request must carry that path and query instead of the original, so the app serves
    /// exactly what the table classified.
    pub fn stamp_parts(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &mut HeaderMap,
        table: &CompiledTable,
        unix: Duration,
    ) -> Result<Stamp, BadPath> {
        let path = normalize_path(uri.path()).map_err(BadPath)?;
        let host = uri.host().or_else(|| headers.get(HOST).and_then(|h| h.to_str().ok()));
        let view = View { method: method.as_str(), path: &path, host, headers };
        let priority = decide(table, &view, unix);
        let rewrite = match path {
            Cow::Borrowed(_) => None,
            Cow::Owned(normal) => Some(with_query(normal, uri.query())?),
        };
        if !self.forward_user_id {
            headers.remove(table.user_header());
        }
        // `insert` replaces every value the client sent under these names.
        headers.insert(self.business.clone(), decimal(priority.business));
        headers.insert(self.user.clone(), decimal(priority.user));
        Ok(Stamp { priority, rewrite })
    }
}

/// What entry stamping decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    pub priority: Priority,
    /// The normalised path and the original query, when they differ from the request's:
    /// forward this instead.
    pub rewrite: Option<PathAndQuery>,
}

/// An entry request refused because its path is ambiguous; answer 400 with this text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("ambiguous request path: {0}")]
pub struct BadPath(pub PathError);

/// The table's verdict for a request: the first matching rule's business class; for a
/// request no rule matches, its size grade when the table has one and the request declares
/// its length; else the default class. The user level is the keyed hash of the user id
/// (anonymous, or an empty id: the least important user level), or the size grade's
/// sub-step for graded requests.
fn decide(table: &CompiledTable, req: &View<'_>, unix: Duration) -> Priority {
    let class = table.classify(req);
    if class.rule.is_none() {
        if let (Some(grade), Some(len)) = (table.size_grade(), content_length(req.headers)) {
            return grade.priority(len);
        }
    }
    let user = match req.headers.get(table.user_header()).map(HeaderValue::as_bytes) {
        Some(id) if !id.trim_ascii().is_empty() => table.user_hasher().user_priority(id, unix),
        // Anonymous callers share the least important user level of their class.
        _ => MAX_USER,
    };
    Priority { business: class.business, user }
}

/// The declared `content-length`, when there is exactly one well-formed value.
fn content_length(headers: &HeaderMap) -> Option<u64> {
    let mut values = headers.get_all(CONTENT_LENGTH).iter();
    let v = values.next()?;
    if values.next().is_some() {
        return None;
    }
    std::str::from_utf8(v.as_bytes()).ok()?.parse().ok()
}

fn with_query(path: String, query: Option<&str>) -> Result<PathAndQuery, BadPath> {
    let text = match query {
        Some(q) => format!("{path}?{q}"),
        None => path,
    };
    // The normalised path only drops or decodes characters a URI already allowed.
    PathAndQuery::try_from(text).map_err(|_| BadPath(PathError::BadEscape))
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

/// The request as the priority table sees it: the normalised path, never the raw one.
struct View<'a> {
    method: &'a str,
    path: &'a str,
    host: Option<&'a str>,
    headers: &'a HeaderMap,
}

impl RequestView for View<'_> {
    fn method(&self) -> &str {
        self.method
    }

    fn path(&self) -> &str {
        self.path
    }

    fn host(&self) -> Option<&str> {
        self.host
    }

    fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.get(name).map(HeaderValue::as_bytes)
    }
}

#[cfg(test)]
mod tests;

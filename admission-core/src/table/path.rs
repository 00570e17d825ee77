//! The path the entry classifies and forwards.
//!
//! An app behind the entry resolves `/api/pay/../../admin` to `/admin`, and
//! `/api/%2e%2e/admin` too. If the table matched the raw path, any client could pick the
//! class of a more important rule by spelling its path through that rule's prefix. So the
//! entry normalises the path once, classifies the normalised form and forwards that same
//! form, and refuses (400) the spellings whose meaning differs between servers.
//!
//! Normalisation (RFC 3986 section 6.2.2, plus slash merging):
//! - percent-escapes of unreserved characters (`A-Z a-z 0-9 - . _ ~`) are decoded
//!   (`%61` -> `a`, `%2e` -> `.`); other escapes keep their meaning and get upper-case hex
//!   (`%3b` -> `%3B`);
//! - runs of `/` become one `/` (`//a///b` -> `/a/b`), as nginx's `merge_slashes` does;
//! - dot-segments are removed (section 5.2.4): `/a/./b` -> `/a/b`, `/a/b/../c` -> `/a/c`,
//!   `/a/b/..` -> `/a/`.
//!
//! Refused as ambiguous (the servers behind an entry disagree on them, so no single
//! normalised form is "what the app will serve"):
//! - an encoded separator, `%2F` or `%5C`, or a raw `\` (some servers decode or treat it as
//!   `/`, some do not), and an encoded NUL `%00`;
//! - `..` that would climb above the root (RFC 3986 clamps it, many servers answer 400,
//!   some map it outside the document root);
//! - a dot-segment carrying parameters, `..;x` or `.;x` (servlet containers strip `;...`
//!   before resolving dots);
//! - a malformed escape (`%zz`, `%4`);
//! - anything that is not an absolute path (except the `*` of `OPTIONS *`).
//!
//! Normalisation is idempotent: a normalised path normalises to itself, so the next hop
//! (or the app) cannot resolve it to something else.

use std::borrow::Cow;

/// Why a path was refused; the entry answers 400 with this text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the path is not absolute (it must start with `/`)")]
    NotAbsolute,
    #[error("the path contains an encoded `/` or `\\` (`%2F`, `%5C`) or a raw `\\`")]
    EncodedSeparator,
    #[error("the path contains an encoded NUL (`%00`)")]
    EncodedNul,
    #[error("the path contains a malformed percent-escape")]
    BadEscape,
    #[error("the path climbs above the root with `..`")]
    AboveRoot,
    #[error("the path contains a dot-segment with parameters (`..;` or `.;`)")]
    DotSegmentWithParams,
}

/// The normalised form of `path` (without the query), or why it is refused. Borrows when
/// the path is already normal, which is the common case and allocates nothing.
pub fn normalize_path(path: &str) -> Result<Cow<'_, str>, PathError> {
    if path == "*" {
        return Ok(Cow::Borrowed(path));
    }
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    if is_normal(path) {
        return Ok(Cow::Borrowed(path));
    }
    let decoded = decode_unreserved(path)?;
    remove_dot_segments(&decoded).map(Cow::Owned)
}

/// Whether `path` (starting with `/`) is already in normal form: no escape, no backslash,
/// no empty segment except a trailing one, no segment starting with `.` that could be a
/// dot-segment. Conservative: `/.well-known` takes the slow path and comes out unchanged.
fn is_normal(path: &str) -> bool {
    let bytes = path.as_bytes();
    if bytes.iter().any(|&b| b == b'%' || b == b'\\') {
        return false;
    }
    // Every `/` must be followed by something other than `/` and `.`, except at the end.
    bytes.windows(2).all(|w| w[0] != b'/' || (w[1] != b'/' && w[1] != b'.'))
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Decodes escapes of unreserved characters, upper-cases the others, refuses separators.
fn decode_unreserved(path: &str) -> Result<String, PathError> {
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => return Err(PathError::EncodedSeparator),
            b'%' => {
                let (hi, lo) = match (bytes.get(i + 1).copied(), bytes.get(i + 2).copied()) {
                    (Some(h), Some(l)) => (hex(h), hex(l)),
                    _ => (None, None),
                };
                let (Some(hi), Some(lo)) = (hi, lo) else { return Err(PathError::BadEscape) };
                let b = hi << 4 | lo;
                match b {
                    b'/' | b'\\' => return Err(PathError::EncodedSeparator),
                    0 => return Err(PathError::EncodedNul),
                    _ if is_unreserved(b) => out.push(char::from(b)),
                    _ => {
                        const HEX: &[u8; 16] = b"0123456789ABCDEF";
                        out.push('%');
                        out.push(char::from(HEX[usize::from(hi)]));
                        out.push(char::from(HEX[usize::from(lo)]));
                    }
                }
                i += 3;
            }
            _ => {
                // A run of ordinary characters; `path` is valid UTF-8 and escapes are ASCII,
                // so slicing at the next `%` or `\` stays on character boundaries.
                let end = bytes[i..]
                    .iter()
                    .position(|&b| b == b'%' || b == b'\\')
                    .map_or(bytes.len(), |n| i + n);
                out.push_str(&path[i..end]);
                i = end;
            }
        }
    }
    Ok(out)
}

/// RFC 3986 section 5.2.4 on an absolute path with empty segments merged; `..` above the
/// root is an error instead of being clamped.
fn remove_dot_segments(path: &str) -> Result<String, PathError> {
    let mut kept: Vec<&str> = Vec::new();
    let mut trailing_slash = false;
    // The first piece is the empty string before the leading `/`.
    let mut segments = path.split('/').skip(1).peekable();
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        match segment {
            "" | "." => trailing_slash = last,
            ".." => {
                kept.pop().ok_or(PathError::AboveRoot)?;
                trailing_slash = last;
            }
            _ if matches!(segment.split(';').next(), Some("." | "..")) => {
                return Err(PathError::DotSegmentWithParams)
            }
            _ => {
                kept.push(segment);
                trailing_slash = false;
            }
        }
    }
    let mut out = String::with_capacity(path.len());
    for segment in &kept {
        out.push('/');
        out.push_str(segment);
    }
    if kept.is_empty() || trailing_slash {
        out.push('/');
    }
    Ok(out)
}

#[cfg(test)]
mod tests;

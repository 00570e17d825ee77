//! The path the entry classifies and forwards (`admission-core/src/table/path.rs`
//! `normalize_path`), on any string and on the path of any request target http accepts.
//!
//! Properties: a normalised path is absolute (or `*`), has no `//`, no `.` or `..` segment
//! (nor one hidden behind `;` parameters), no backslash, no escape of an unreserved
//! character, no lower-case escape; normalising it again gives itself (idempotent); a path
//! already in normal form is borrowed, not copied; what is refused is refused for a reason
//! the input shows (an escape, a dot-segment, or not absolute).
#![no_main]

use std::borrow::Cow;

use admission_core::table::{normalize_path, PathError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    if let Ok(path) = std::str::from_utf8(input) {
        check(path);
    }
    if let Ok(uri) = http::Uri::try_from(input) {
        check(uri.path());
    }
});

fn check(path: &str) {
    let normal = match normalize_path(path) {
        Ok(normal) => normal,
        Err(e) => return refused_for_a_reason(path, e),
    };
    if normal == "*" {
        assert_eq!(path, "*");
        return;
    }
    assert!(normal.starts_with('/'), "{normal:?} is not absolute");
    assert!(!normal.contains("//"), "{normal:?} has an empty segment");
    assert!(!normal.contains('\\'), "{normal:?} has a backslash");
    for segment in normal.split('/') {
        let name = segment.split(';').next().unwrap_or_default();
        assert!(name != "." && name != "..", "{normal:?} has a dot-segment");
    }
    let bytes = normal.as_bytes();
    for (i, _) in normal.match_indices('%') {
        let (hi, lo) = (bytes.get(i + 1).copied(), bytes.get(i + 2).copied());
        let hex = |b: Option<u8>| b.filter(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(b));
        let (Some(hi), Some(lo)) = (hex(hi), hex(lo)) else {
            panic!("{normal:?} has a malformed or lower-case escape at {i}")
        };
        let decoded = u8::from_str_radix(std::str::from_utf8(&[hi, lo]).unwrap(), 16).unwrap();
        let unreserved = decoded.is_ascii_alphanumeric() || b"-._~".contains(&decoded);
        assert!(!unreserved, "{normal:?} keeps an escape of {:?}", char::from(decoded));
        assert!(!b"/\\\0".contains(&decoded), "{normal:?} keeps an escaped separator");
    }
    assert_eq!(normalize_path(&normal).as_deref(), Ok(&*normal), "not idempotent");
    if let Cow::Borrowed(_) = normal {
        assert_eq!(normal, path);
    }
    // What is already normal is classified as it is, so it must not be refused or changed.
    if normal == path {
        assert_eq!(normalize_path(path).as_deref(), Ok(path));
    }
}

fn refused_for_a_reason(path: &str, e: PathError) {
    let lower = path.to_ascii_lowercase();
    let shows = match e {
        PathError::NotAbsolute => !path.starts_with('/'),
        PathError::EncodedSeparator => {
            path.contains('\\') || lower.contains("%2f") || lower.contains("%5c")
        }
        PathError::EncodedNul => lower.contains("%00"),
        PathError::BadEscape => path.contains('%'),
        PathError::AboveRoot => path.contains("..") || lower.contains("%2e"),
        PathError::DotSegmentWithParams => {
            path.contains(".;") || lower.contains("%2e;") || lower.contains("%2e%3b")
        }
    };
    assert!(shows, "{path:?} refused as {e:?}");
}

//! The priority headers: `x-business-priority`, `x-user-priority` (inner hop,
//! `proxy/src/priority.rs` over `admission-core/src/priority.rs`), `x-admission-level` (the
//! egress's downstream cache, `admission-core/src/downstream.rs`), and the entry's stamping
//! of a request target (normalised path, table verdict, the client's claims replaced).
//!
//! Properties: each parser accepts exactly its grammar (checked against a naive reference);
//! a level round-trips through its encoding; the cache holds a level iff exactly one valid
//! value arrived; the inner hop falls back exactly as documented; the entry stamps exactly
//! one business and one user value, and the forwarded (rewritten) target stamps the same.
#![no_main]

use std::borrow::Cow;
use std::sync::OnceLock;
use std::time::Duration;

use admission_core::downstream::{DownstreamLevels, Observation};
use admission_core::priority::{parse_business, parse_user, MAX_USER};
use admission_core::size_grade::SizeGradeConfig;
use admission_core::table::{normalize_path, CompiledTable, PriorityTable};
use admission_core::{AdmissionLevel, ManualClock, Priority};
use arbitrary::Arbitrary;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri};
use libfuzzer_sys::fuzz_target;
use weir_proxy::priority::PriorityHeaders;

#[derive(Debug, Arbitrary)]
struct Input<'a> {
    business: Vec<&'a [u8]>,
    user: Vec<&'a [u8]>,
    levels: Vec<&'a [u8]>,
    target: &'a [u8],
    user_id: Option<&'a [u8]>,
    content_length: Option<&'a [u8]>,
    unix_secs: u32,
}

fuzz_target!(|input: Input<'_>| {
    for v in input.business.iter().chain(&input.user).chain(&input.levels) {
        parsers_accept_exactly_their_grammar(v);
    }
    downstream_cache(&input.levels);
    inner_hop(&input);
    entry(&input);
});

/// Strict unsigned decimal up to `max`, leading zeros allowed: the documented grammar.
fn reference_decimal(v: &[u8], max: u64) -> Option<u64> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let digits = &v[v.iter().position(|&b| b != b'0').unwrap_or(v.len())..];
    if digits.len() > 3 {
        return None;
    }
    let n = std::str::from_utf8(digits).unwrap().parse::<u64>().unwrap_or(0);
    (n <= max).then_some(n)
}

fn parsers_accept_exactly_their_grammar(v: &[u8]) {
    assert_eq!(parse_business(v).ok().map(u64::from), reference_decimal(v, 255), "{v:?}");
    assert_eq!(parse_user(v).ok().map(u64::from), reference_decimal(v, 127), "{v:?}");
    let reference = v.iter().position(|&b| b == b'.').and_then(|dot| {
        let business = reference_decimal(&v[..dot], 255)?;
        let user = reference_decimal(&v[dot + 1..], 127)?;
        Some(Priority::new(business as u8, user as u8).unwrap())
    });
    let parsed = AdmissionLevel::parse(v).ok();
    assert_eq!(parsed.map(AdmissionLevel::priority), reference, "{v:?}");
    if let Some(level) = parsed {
        let encoded = level.encode();
        assert!(encoded.as_bytes().len() <= 7);
        assert_eq!(encoded.as_str().as_bytes(), encoded.as_bytes());
        assert_eq!(AdmissionLevel::parse(encoded.as_bytes()), Ok(level), "round trip");
    }
}

/// One response carrying `values` as its `x-admission-level`s.
fn downstream_cache(values: &[&[u8]]) {
    let clock = ManualClock::new();
    let cache = DownstreamLevels::new(Duration::from_secs(2), 4, clock.clone());
    let observed = cache.observe("b.svc:80", values.iter().copied());
    let want = match values {
        [] => None,
        [one] => AdmissionLevel::parse(one).ok(),
        _ => None,
    };
    match observed {
        Observation::Cached(level) => assert_eq!(Some(level), want),
        Observation::Absent => assert!(values.is_empty()),
        Observation::Repeated => assert!(values.len() > 1),
        Observation::Malformed(_) => assert!(values.len() == 1 && want.is_none()),
        Observation::Uncached(_) => panic!("uncached with a free slot"),
    }
    assert_eq!(cache.level("b.svc:80"), want);
    if let Some(level) = want {
        assert!(!cache.should_refuse("b.svc:80", level.priority()));
        assert!(!cache.should_refuse("other:80", Priority::LEAST_IMPORTANT));
        clock.advance(Duration::from_secs(2));
        assert_eq!(cache.level("b.svc:80"), None, "expired");
    }
}

fn headers_named() -> PriorityHeaders {
    PriorityHeaders {
        business: HeaderName::from_static("x-business-priority"),
        user: HeaderName::from_static("x-user-priority"),
        forward_user_id: false,
        default: None,
    }
}

fn header_map(input: &Input<'_>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let names = [("x-business-priority", &input.business), ("x-user-priority", &input.user)];
    for (name, values) in names {
        for v in values.iter() {
            if let Ok(v) = HeaderValue::from_bytes(v) {
                headers.append(name, v);
            }
        }
    }
    let optional = [("x-user-id", input.user_id), ("content-length", input.content_length)];
    for (name, value) in optional {
        if let Some(v) = value.and_then(|v| HeaderValue::from_bytes(v).ok()) {
            headers.append(name, v);
        }
    }
    headers
}

/// The value of `name` when it is the only one and parses with `parse`.
fn single(headers: &HeaderMap, name: &str, parse: fn(&[u8]) -> Option<u8>) -> Option<u8> {
    let mut all = headers.get_all(name).iter();
    match (all.next(), all.next()) {
        (Some(v), None) => parse(v.as_bytes()),
        _ => None,
    }
}

fn inner_hop(input: &Input<'_>) {
    let headers = header_map(input);
    let default = Priority::new(9, 99).unwrap();
    let read = headers_named().read(&headers, default);
    let business = single(&headers, "x-business-priority", |v| parse_business(v).ok());
    let user = single(&headers, "x-user-priority", |v| parse_user(v).ok());
    let want = match (business, user) {
        (Some(business), Some(user)) => Priority { business, user },
        (Some(business), None) => Priority { business, user: default.user },
        (None, _) => default,
    };
    assert_eq!(read.priority, want);
    assert_eq!(read.invalid.is_none(), business.is_some() && user.is_some());
    assert!(read.priority.user <= MAX_USER);
}

fn table() -> &'static CompiledTable {
    static TABLE: OnceLock<CompiledTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = PriorityTable::embedded_default();
        table.size_grade = Some(SizeGradeConfig::default());
        table.compile_with_secret(b"fuzz").expect("the embedded table with a size grade")
    })
}

fn entry(input: &Input<'_>) {
    let Ok(uri) = Uri::try_from(input.target) else { return };
    let mut headers = header_map(input);
    let unix = Duration::from_secs(input.unix_secs.into());
    let stamped = headers_named().stamp_parts(&Method::POST, &uri, &mut headers, table(), unix);
    let normal = normalize_path(uri.path());
    let stamp = match stamped {
        Err(_) => {
            assert!(normal.is_err(), "refused the path {:?}", uri.path());
            return;
        }
        Ok(stamp) => stamp,
    };
    let normal = normal.expect("stamped an ambiguous path");
    assert!(stamp.priority.user <= MAX_USER);
    let business = stamp.priority.business.to_string();
    let user = stamp.priority.user.to_string();
    for (name, want) in [("x-business-priority", &business), ("x-user-priority", &user)] {
        let values: Vec<_> = headers.get_all(name).iter().collect();
        assert_eq!(values, [want.as_str()], "{name} stamped once, the table's verdict");
    }
    assert!(!headers.contains_key("x-user-id"), "the user id is not forwarded");
    match (&stamp.rewrite, normal) {
        (None, Cow::Borrowed(_)) => {}
        (Some(rewrite), Cow::Owned(normal)) => {
            assert_eq!(rewrite.path(), normal);
            assert_eq!(rewrite.query(), uri.query());
            assert_eq!(normalize_path(rewrite.path()), Ok(Cow::Borrowed(rewrite.path())));
            // The next hop sees the forwarded target: the same verdict.
            let forwarded = Uri::from(rewrite.clone());
            let mut again = header_map(input);
            let next =
                headers_named().stamp_parts(&Method::POST, &forwarded, &mut again, table(), unix);
            let next = next.expect("the forwarded target is not ambiguous");
            assert_eq!(next.priority, stamp.priority);
            let same = next.rewrite.as_ref().is_none_or(|r| r.path() == rewrite.path());
            assert!(same, "normalised twice: {:?}", next.rewrite);
        }
        (rewrite, normal) => panic!("rewrite {rewrite:?} for normal form {normal:?}"),
    }
}

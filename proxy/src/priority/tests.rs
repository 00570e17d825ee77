use std::time::Duration;

use admission_core::table::PriorityTable;
use http::{HeaderMap, Method, Uri};

use super::*;

fn headers() -> PriorityHeaders {
    PriorityHeaders {
        business: HeaderName::from_static("x-business-priority"),
        user: HeaderName::from_static("x-user-priority"),
        forward_user_id: false,
        default: None,
    }
}

/// A request's header map (what `read` sees).
struct Request {
    headers: HeaderMap,
}

fn request(method: &str, path: &str, pairs: &[(&'static str, &str)]) -> Request {
    let (_, _, headers) = parts(method, path, pairs);
    Request { headers }
}

const DEFAULT: Priority = Priority { business: 200, user: 127 };

#[test]
fn reads_well_formed_headers() {
    let req = request("GET", "/", &[("x-business-priority", "3"), ("x-user-priority", "77")]);
    let read = headers().read(&req.headers, DEFAULT);
    assert_eq!(read, ReadPriority { priority: Priority { business: 3, user: 77 }, invalid: None });
}

#[test]
fn missing_or_malformed_business_falls_back_whole() {
    for (pairs, reason) in [
        (vec![], InvalidReason::Missing),
        (vec![("x-business-priority", "-1"), ("x-user-priority", "1")], InvalidReason::Negative),
        (vec![("x-business-priority", "256"), ("x-user-priority", "1")], InvalidReason::OutOfRange),
        (vec![("x-business-priority", "abc"), ("x-user-priority", "1")], InvalidReason::NotNumeric),
        (vec![("x-business-priority", " 3"), ("x-user-priority", "1")], InvalidReason::Padded),
        (vec![("x-business-priority", "1"), ("x-business-priority", "2")], InvalidReason::Repeated),
    ] {
        let req = request("GET", "/", &pairs);
        let read = headers().read(&req.headers, DEFAULT);
        assert_eq!(read, ReadPriority { priority: DEFAULT, invalid: Some(reason) }, "{pairs:?}");
    }
}

/// The shortcut for a head known to lack the business header answers what `read` does,
/// with or without a user header.
#[test]
fn business_missing_is_what_read_answers_without_the_business_header() {
    for pairs in [vec![], vec![("x-user-priority", "1")], vec![("x-user-priority", "x")]] {
        let req = request("GET", "/", &pairs);
        let read = headers().read(&req.headers, DEFAULT);
        assert_eq!(read, ReadPriority::business_missing(DEFAULT), "{pairs:?}");
    }
}

#[test]
fn malformed_user_keeps_business() {
    let req = request("GET", "/", &[("x-business-priority", "4"), ("x-user-priority", "128")]);
    let read = headers().read(&req.headers, DEFAULT);
    assert_eq!(read.priority, Priority { business: 4, user: 127 });
    assert_eq!(read.invalid, Some(InvalidReason::OutOfRange));
}

#[test]
fn entry_replaces_client_headers_and_drops_the_user_id() {
    let table = PriorityTable::embedded_default().compile_with_secret(b"k").unwrap();
    let (method, uri, mut h) = parts(
        "POST",
        "/api/login",
        &[("x-business-priority", "0"), ("x-user-priority", "0"), ("x-user-id", "alice")],
    );
    let unix = Duration::from_secs(1_700_000_000);
    let p = headers().stamp_parts(&method, &uri, &mut h, &table, unix).unwrap().priority;
    assert_eq!(p.business, 0, "login rule");
    assert_eq!(p.user, table.user_hasher().user_priority(b"alice", unix));
    assert_eq!(h.get_all("x-business-priority").iter().count(), 1);
    assert_eq!(h["x-user-priority"], p.user.to_string().as_str());
    assert!(h.get("x-user-id").is_none());

    let (method, uri, mut h) =
        parts("GET", "/other", &[("x-business-priority", "0"), ("x-user-priority", "0")]);
    let p = headers().stamp_parts(&method, &uri, &mut h, &table, unix).unwrap().priority;
    assert_eq!(p, Priority { business: table.least_important_business(), user: 127 });
    assert_eq!(h["x-business-priority"], p.business.to_string().as_str());
}

#[test]
fn entry_can_forward_the_user_id() {
    let table = PriorityTable::embedded_default().compile_with_secret(b"k").unwrap();
    let mut h = headers();
    h.forward_user_id = true;
    let (method, uri, mut headers) = parts("GET", "/", &[("x-user-id", "bob")]);
    h.stamp_parts(&method, &uri, &mut headers, &table, Duration::ZERO).unwrap();
    assert_eq!(headers["x-user-id"], "bob");
}

fn parts(method: &str, uri: &str, pairs: &[(&'static str, &str)]) -> (Method, Uri, HeaderMap) {
    let mut headers = HeaderMap::new();
    for (name, value) in pairs {
        headers.append(*name, HeaderValue::from_str(value).unwrap());
    }
    (method.parse().unwrap(), uri.parse().unwrap(), headers)
}

#[test]
fn entry_classifies_and_forwards_the_normalised_path() {
    let table = PriorityTable::from_yaml(
        "default_business: 200\nrules:\n  - { name: pay, match: { path_prefix: /api/pay/ }, business: 1 }\n  \
         - { name: admin, match: { path_prefix: /admin }, business: 9 }\n",
    )
    .unwrap()
    .compile_with_secret(b"k")
    .unwrap();
    for (raw, business, forwarded) in [
        ("/api/pay/x?a=1", 1, None),
        ("/api/pay/../../admin/delete?a=1", 9, Some("/admin/delete?a=1")),
        ("/api/pay/%2e%2e/%2e%2e/admin", 9, Some("/admin")),
        ("//api//pay//x", 1, Some("/api/pay/x")),
        ("/api/%70ay/x", 1, Some("/api/pay/x")),
    ] {
        let (method, uri, mut h) = parts("GET", raw, &[("x-business-priority", "0")]);
        let stamp = headers().stamp_parts(&method, &uri, &mut h, &table, Duration::ZERO).unwrap();
        assert_eq!(stamp.priority.business, business, "{raw}");
        assert_eq!(stamp.rewrite.as_ref().map(|p| p.as_str()), forwarded, "{raw}");
        assert_eq!(h["x-business-priority"], business.to_string().as_str(), "{raw}");
    }
    for raw in ["/api/pay/..%2F..%2Fadmin", "/api/pay/../../../admin", "/api/pay/..;/admin"] {
        let (method, uri, mut h) = parts("GET", raw, &[]);
        let e = headers().stamp_parts(&method, &uri, &mut h, &table, Duration::ZERO).unwrap_err();
        assert!(e.to_string().starts_with("ambiguous request path"), "{raw}: {e}");
    }
}

#[test]
fn an_empty_user_id_is_anonymous() {
    let table = PriorityTable::embedded_default().compile_with_secret(b"k").unwrap();
    for id in ["", "  "] {
        let (method, uri, mut h) = parts("GET", "/", &[("x-user-id", id)]);
        let stamp = headers().stamp_parts(&method, &uri, &mut h, &table, Duration::ZERO).unwrap();
        assert_eq!(stamp.priority.user, MAX_USER, "{id:?}");
    }
}

#[test]
fn unmatched_requests_take_the_size_grade() {
    let table = PriorityTable::from_yaml(
        "default_business: 250\nrules:\n  - { name: pay, match: { path: /pay }, business: 1 }\n\
         size_grade: { business: 100, min_bytes: 64, max_bytes: 1048576, sub_bits: 7 }\n",
    )
    .unwrap()
    .compile()
    .unwrap();
    let grade = *table.size_grade().unwrap();
    let stamp = |uri: &str, len: Option<&str>| {
        let pairs: Vec<(&'static str, &str)> =
            len.map(|l| ("content-length", l)).into_iter().collect();
        let (method, uri, mut h) = parts("POST", uri, &pairs);
        headers().stamp_parts(&method, &uri, &mut h, &table, Duration::ZERO).unwrap().priority
    };
    assert_eq!(stamp("/pay", Some("100")).business, 1, "a matching rule wins over the grade");
    assert_eq!(stamp("/x", Some("100")), grade.priority(100));
    assert_eq!(stamp("/x", Some("5000")), grade.priority(5000));
    assert!(stamp("/x", Some("5000")) < stamp("/x", Some("100")), "larger is more important");
    assert_eq!(stamp("/x", None).business, 250, "no declared length: the default class");
}

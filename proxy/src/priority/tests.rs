use std::time::Duration;

use admission_core::table::PriorityTable;

use super::*;

fn headers() -> PriorityHeaders {
    PriorityHeaders {
        business: HeaderName::from_static("x-business-priority"),
        user: HeaderName::from_static("x-user-priority"),
        forward_user_id: false,
        default: None,
    }
}

fn request(method: &str, path: &str, pairs: &[(&'static str, &str)]) -> RequestHeader {
    let mut req = RequestHeader::build(method, path.as_bytes(), None).unwrap();
    for (name, value) in pairs {
        req.append_header(*name, *value).unwrap();
    }
    req
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
    let mut req = request(
        "POST",
        "/api/login",
        &[("x-business-priority", "0"), ("x-user-priority", "0"), ("x-user-id", "alice")],
    );
    let unix = Duration::from_secs(1_700_000_000);
    let p = headers().stamp(&mut req, &table, unix);
    assert_eq!(p.business, 0, "login rule");
    assert_eq!(p.user, table.user_hasher().user_priority(b"alice", unix));
    assert_eq!(req.headers.get_all("x-business-priority").iter().count(), 1);
    assert_eq!(req.headers["x-user-priority"], p.user.to_string().as_str());
    assert!(req.headers.get("x-user-id").is_none());

    let mut req =
        request("GET", "/other", &[("x-business-priority", "0"), ("x-user-priority", "0")]);
    let p = headers().stamp(&mut req, &table, unix);
    assert_eq!(p, Priority { business: table.least_important_business(), user: 127 });
    assert_eq!(req.headers["x-business-priority"], p.business.to_string().as_str());
}

#[test]
fn entry_can_forward_the_user_id() {
    let table = PriorityTable::embedded_default().compile_with_secret(b"k").unwrap();
    let mut h = headers();
    h.forward_user_id = true;
    let mut req = request("GET", "/", &[("x-user-id", "bob")]);
    h.stamp(&mut req, &table, Duration::ZERO);
    assert_eq!(req.headers["x-user-id"], "bob");
}

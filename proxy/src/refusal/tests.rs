use super::*;
use admission_core::Priority;

fn refusals() -> Refusals {
    Refusals::new(
        HeaderName::from_static("x-admission-level"),
        HeaderName::from_static("x-weir-shed"),
        Duration::from_millis(1500),
    )
}

fn level(b: u8, u: u8) -> AdmissionLevel {
    AdmissionLevel::new(Priority { business: b, user: u })
}

#[test]
fn http_refusal_is_503_with_retry_after() {
    let r = refusals().response(false, ShedReason::Overload, level(3, 64));
    assert_eq!(r.status, 503);
    assert_eq!(r.headers["retry-after"], "2");
    assert_eq!(r.headers["x-weir-shed"], "overload");
    assert_eq!(r.headers["x-admission-level"], "3.64");
    assert_eq!(r.headers["content-length"], "0");
}

#[test]
fn grpc_refusal_is_trailers_only_resource_exhausted() {
    let r = refusals().response(true, ShedReason::Deadline, level(0, 0));
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["grpc-status"], "8");
    assert_eq!(r.headers["grpc-retry-pushback-ms"], "1500");
    assert_eq!(r.headers["content-type"], "application/grpc");
    assert_eq!(r.headers["x-weir-shed"], "deadline");
    assert!(r.headers.get("retry-after").is_none());
}

#[test]
fn level_value_follows_the_level() {
    let r = refusals();
    assert_eq!(r.level_value(level(255, 127)), "255.127");
    assert_eq!(r.level_value(level(7, 1)), "7.1");
    assert_eq!(r.level_value(level(7, 1)), "7.1");
    assert_eq!(r.level_value(level(8, 0)), "8.0");
}

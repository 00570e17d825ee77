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
    let (status, headers) = refusals().refusal_head(false, ShedReason::Overload);
    assert_eq!(status, 503);
    assert_eq!(headers["retry-after"], "2");
    assert_eq!(headers["x-weir-shed"], "overload");
    assert_eq!(headers["content-length"], "0");
    assert_eq!(headers["x-envoy-overloaded"], "true", "Envoy must not retry a refusal");
}

#[test]
fn grpc_refusal_is_trailers_only_resource_exhausted() {
    let (status, headers) = refusals().refusal_head(true, ShedReason::Deadline);
    assert_eq!(status, 200);
    assert_eq!(headers["grpc-status"], "8");
    assert_eq!(headers["grpc-retry-pushback-ms"], "1500");
    assert_eq!(headers["content-type"], "application/grpc");
    assert_eq!(headers["x-weir-shed"], "deadline");
    assert_eq!(headers["x-envoy-overloaded"], "true", "Envoy must not retry a refusal");
    assert!(headers.get("retry-after").is_none());
    assert!(headers.get("content-length").is_none(), "trailers-only: no body at all");
}

#[test]
fn weirs_own_errors_map_to_grpc_statuses_for_grpc_callers() {
    let r = refusals();
    for (error, status, grpc) in [
        (WeirError::AppUnreachable, 502, "14"),
        (WeirError::AppTimeout, 504, "4"),
        (WeirError::BadRequest, 400, "13"),
    ] {
        let (code, headers) = r.error_head(error, true);
        assert_eq!(code, StatusCode::OK, "{status}");
        assert_eq!(headers["grpc-status"], grpc, "{status}");
        assert_eq!(headers["x-weir-error"], error.as_str());
        let (code, headers) = r.error_head(error, false);
        assert_eq!(code.as_u16(), status);
        assert_eq!(headers["content-length"], "0");
        assert_eq!(headers["x-weir-error"], error.as_str());
    }
}

#[test]
fn every_weir_error_names_itself_and_gateway_errors_say_whose_side_failed() {
    let mut seen = std::collections::BTreeSet::new();
    for e in WeirError::ALL {
        assert!(seen.insert(e.as_str()), "{} twice", e.as_str());
        assert!(HeaderValue::from_str(e.as_str()).is_ok());
        if matches!(e.status().as_u16(), 502 | 504) {
            assert!(
                ["app-", "downstream-", "caller-"].iter().any(|side| e.as_str().starts_with(side)),
                "{e:?}"
            );
        }
    }
}

#[test]
fn level_value_follows_the_level() {
    let r = refusals();
    assert_eq!(r.level_value(level(255, 127)), "255.127");
    assert_eq!(r.level_value(level(7, 1)), "7.1");
    assert_eq!(r.level_value(level(7, 1)), "7.1");
    assert_eq!(r.level_value(level(8, 0)), "8.0");
}

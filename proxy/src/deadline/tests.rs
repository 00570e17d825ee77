use super::*;

#[test]
fn grpc_timeout_units() {
    assert_eq!(parse_grpc_timeout(b"480m"), Some(Duration::from_millis(480)));
    assert_eq!(parse_grpc_timeout(b"2S"), Some(Duration::from_secs(2)));
    assert_eq!(parse_grpc_timeout(b"1H"), Some(Duration::from_secs(3600)));
    assert_eq!(parse_grpc_timeout(b"5M"), Some(Duration::from_secs(300)));
    assert_eq!(parse_grpc_timeout(b"7u"), Some(Duration::from_micros(7)));
    assert_eq!(parse_grpc_timeout(b"9n"), Some(Duration::from_nanos(9)));
}

#[test]
fn grpc_timeout_rejects_garbage() {
    for bad in [&b""[..], b"m", b"12", b"12x", b"-1m", b"123456789m", b"1 m"] {
        assert_eq!(parse_grpc_timeout(bad), None, "{:?}", String::from_utf8_lossy(bad));
    }
}

/// Fuzz finding (fuzz/fuzz_targets/deadline.rs): `99999999H` was 11,000 years, past the
/// engine's `u64` nanoseconds, so `arrival + budget` wrapped to an arbitrary deadline.
#[test]
fn grpc_timeout_is_capped() {
    assert_eq!(parse_grpc_timeout(b"99999999H"), Some(MAX_BUDGET));
    assert_eq!(parse_grpc_timeout(b"99999999M"), Some(MAX_BUDGET));
    assert_eq!(parse_grpc_timeout(b"8000000H"), Some(MAX_BUDGET));
    assert_eq!(parse_grpc_timeout(b"99999999S"), Some(Duration::from_secs(99_999_999)));
    assert_eq!(parse_timeout_ms(b"999999999999"), Some(MAX_BUDGET));
    // A year of uptime plus the longest budget still fits the engine's clock.
    let year = Duration::from_secs(366 * 24 * 3600);
    assert!((MAX_BUDGET + year).as_nanos() < u128::from(u64::MAX));
}

#[test]
fn timeout_ms() {
    assert_eq!(parse_timeout_ms(b"480"), Some(Duration::from_millis(480)));
    assert_eq!(parse_timeout_ms(b"0"), Some(Duration::ZERO));
    assert_eq!(parse_timeout_ms(b""), None);
    assert_eq!(parse_timeout_ms(b"4.5"), None);
    assert_eq!(parse_timeout_ms(b"9999999999999"), None);
}

#[test]
fn formats_without_allocating() {
    let mut buf = [0u8; 20];
    assert_eq!(format_ms(Duration::from_millis(473), &mut buf), b"473");
    assert_eq!(format_ms(Duration::from_micros(10), &mut buf), b"1");
    assert_eq!(format_grpc_ms(Duration::from_millis(12), &mut buf), b"12m");
    assert_eq!(format_grpc_ms(Duration::from_secs(10_000_000), &mut buf), b"99999999m");
}

/// The header value of every budget, from the table or formatted, is what `format_ms` writes.
#[test]
fn ms_values_match_format_ms_across_the_table_and_beyond() {
    let mut buf = [0u8; 20];
    let ms = (0..12_000).chain([99_999, 123_456_789, u64::MAX / 1_000_000]);
    for d in ms.map(Duration::from_millis).chain([Duration::from_micros(10), Duration::MAX]) {
        let expected = format_ms(d, &mut buf).to_vec();
        assert_eq!(ms_value(d).as_bytes(), &expected[..], "{d:?}");
    }
}

#[test]
fn a_declared_budget_is_capped() {
    let name = HeaderName::from_static("x-request-timeout-ms");
    let (default, max) = (Duration::from_millis(500), Duration::from_millis(500));
    let budget = |pairs: &[(&str, &str)]| {
        let mut headers = HeaderMap::new();
        for (k, v) in pairs {
            headers.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        caller_budget(&headers, &name, default, max)
    };
    assert_eq!(budget(&[]), default);
    assert_eq!(budget(&[("x-request-timeout-ms", "120")]), Duration::from_millis(120));
    assert_eq!(budget(&[("x-request-timeout-ms", "3600000")]), max);
    assert_eq!(budget(&[("grpc-timeout", "99999999H")]), max);
    assert_eq!(budget(&[("grpc-timeout", "80m"), ("x-request-timeout-ms", "9")]), max / 25 * 4);
    assert_eq!(budget(&[("grpc-timeout", "soon"), ("x-request-timeout-ms", "90")]), max / 50 * 9);
    // The cap is on what callers declare; the task timeout is the operator's own.
    let mut headers = HeaderMap::new();
    headers.insert("x-other", "1".parse().unwrap());
    assert_eq!(caller_budget(&headers, &name, default, Duration::from_millis(50)), default);
}

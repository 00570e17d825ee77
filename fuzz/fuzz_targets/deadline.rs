//! The deadline headers a caller sends: `grpc-timeout` and `x-request-timeout-ms`
//! (`proxy/src/deadline.rs`), and the budget forms weir forwards.
//!
//! Properties: a parsed budget never exceeds `MAX_BUDGET` (so `arrival + budget` fits the
//! engine's nanosecond clock); a value parses only if it is the grammar (digits, and one
//! unit for `grpc-timeout`); what weir forwards parses back to the same milliseconds.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use weir_proxy::deadline::{
    format_grpc_ms, format_ms, parse_grpc_timeout, parse_timeout_ms, MAX_BUDGET,
};

fuzz_target!(|value: &[u8]| {
    if let Some(budget) = parse_timeout_ms(value) {
        assert!(budget <= MAX_BUDGET, "{budget:?} above the cap");
        assert!(value.iter().all(u8::is_ascii_digit), "accepted a non-digit");
        forwards_the_same_milliseconds(budget);
        // Canonical decimal: the value without its leading zeros (`0` for zero, which is
        // forwarded as the 1 ms minimum).
        let digits = match value.iter().position(|&b| b != b'0') {
            Some(i) => &value[i..],
            None => b"0",
        };
        let mut buf = [0u8; 20];
        if budget >= Duration::from_millis(1) {
            assert_eq!(format_ms(budget, &mut buf), digits);
        }
    }
    if let Some(budget) = parse_grpc_timeout(value) {
        assert!(budget <= MAX_BUDGET, "{budget:?} above the cap");
        let (unit, digits) = value.split_last().expect("accepted an empty value");
        assert!(b"HMSmun".contains(unit), "accepted unit {unit}");
        assert!((1..=8).contains(&digits.len()), "accepted {} digits", digits.len());
        assert!(digits.iter().all(u8::is_ascii_digit), "accepted a non-digit");
        forwards_the_same_milliseconds(budget);
        // Below the cap the value is exact: parsing it back as a number of units agrees.
        let n: u64 = std::str::from_utf8(digits).unwrap().parse().unwrap();
        let exact = match unit {
            b'H' => Duration::from_secs(n * 3600),
            b'M' => Duration::from_secs(n * 60),
            b'S' => Duration::from_secs(n),
            b'm' => Duration::from_millis(n),
            b'u' => Duration::from_micros(n),
            _ => Duration::from_nanos(n),
        };
        assert_eq!(budget, exact.min(MAX_BUDGET));
    }
});

/// The two forms weir writes for the app or the downstream parse back to the budget's
/// whole milliseconds (at least 1; `grpc-timeout` at most 8 digits).
fn forwards_the_same_milliseconds(budget: Duration) {
    let ms = budget.as_millis().max(1);
    let mut buf = [0u8; 20];
    let written = format_ms(budget, &mut buf).to_vec();
    let back = parse_timeout_ms(&written).expect("weir's own x-request-timeout-ms parses");
    assert_eq!(back.as_millis(), ms);
    let written = format_grpc_ms(budget, &mut buf).to_vec();
    let back = parse_grpc_timeout(&written).expect("weir's own grpc-timeout parses");
    assert_eq!(back.as_millis(), ms.min(99_999_999));
}

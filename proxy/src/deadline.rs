//! Request deadlines: the remaining budget a caller grants (`grpc-timeout`, or
//! `x-request-timeout-ms`), capped by `inbound.max_budget`, and the reduced budget forwarded
//! to the app.

use std::sync::OnceLock;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

/// gRPC's deadline header.
pub const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// The longest budget a caller can grant: the largest `x-request-timeout-ms` (12 digits,
/// ~31.7 years). Longer `grpc-timeout`s (`99999999H` is 11,000 years) are clamped to it, so
/// `arrival + budget` always fits the engine's nanosecond clock (`u64`, 584 years).
pub const MAX_BUDGET: Duration = Duration::from_millis(999_999_999_999);

/// The longest `grpc-timeout` value: 8 ASCII digits (gRPC over HTTP/2 spec).
const GRPC_TIMEOUT_MAX_DIGITS: usize = 8;

/// The budget a request arrives with: `grpc-timeout`, else `timeout_header` (an
/// unparsable value counts as absent), never more than `max` whatever the caller declared
/// (`x-request-timeout-ms: 3600000` at an entry whose cap is 500 ms is 500 ms, and is
/// forwarded as what remains of 500 ms); `default` when it declared none (the operator's
/// own task timeout, not a caller's claim, so not capped).
pub fn caller_budget(
    headers: &HeaderMap,
    timeout_header: &HeaderName,
    default: Duration,
    max: Duration,
) -> Duration {
    let grpc = headers.get(GRPC_TIMEOUT).and_then(|v| parse_grpc_timeout(v.as_bytes()));
    grpc.or_else(|| headers.get(timeout_header).and_then(|v| parse_timeout_ms(v.as_bytes())))
        .map_or(default, |declared| declared.min(max))
}

/// Parses a gRPC `grpc-timeout` value such as `480m` (H, M, S, m, u, n units), at most
/// [`MAX_BUDGET`].
pub fn parse_grpc_timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > GRPC_TIMEOUT_MAX_DIGITS {
        return None;
    }
    // At most 99,999,999 hours: no overflow in `u64` seconds.
    let n = parse_digits(digits)?;
    let budget = match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    };
    Some(budget.min(MAX_BUDGET))
}

/// Parses `x-request-timeout-ms: 480`; 12 digits at most, so never above [`MAX_BUDGET`].
pub fn parse_timeout_ms(value: &[u8]) -> Option<Duration> {
    if value.is_empty() || value.len() > 12 {
        return None;
    }
    parse_digits(value).map(Duration::from_millis)
}

fn parse_digits(digits: &[u8]) -> Option<u64> {
    digits
        .iter()
        .try_fold(0u64, |acc, &b| b.is_ascii_digit().then(|| acc * 10 + u64::from(b - b'0')))
}

/// Writes a remaining budget as decimal milliseconds into `buf` without allocating; returns
/// the used prefix. At least 1 ms, so an app never sees a zero budget it would reject.
pub fn format_ms(remaining: Duration, buf: &mut [u8; 20]) -> &[u8] {
    let ms = remaining.as_millis().clamp(1, u128::from(u64::MAX)) as u64;
    format_u64(ms, buf)
}

/// A remaining budget as decimal milliseconds ([`format_ms`]), as a header value. Below
/// [`STATIC_MS`] it points into a table built once, so forwarding a budget allocates nothing.
pub fn ms_value(remaining: Duration) -> HeaderValue {
    let ms = remaining.as_millis().clamp(1, u128::from(u64::MAX)) as u64;
    if ms < STATIC_MS {
        return HeaderValue::from_static(static_decimal(ms));
    }
    let mut buf = [0u8; 20];
    HeaderValue::from_bytes(format_u64(ms, &mut buf)).expect("decimal digits are a header value")
}

/// Budgets below this many milliseconds are forwarded from the table of [`ms_value`].
const STATIC_MS: u64 = 10_000;

/// `n` (below [`STATIC_MS`]) in decimal, a slice of one string of every such number in
/// turn ("0123...9989999", 38,890 bytes).
fn static_decimal(n: u64) -> &'static str {
    static ALL: OnceLock<&'static str> = OnceLock::new();
    let all = ALL.get_or_init(|| {
        let all: String = (0..STATIC_MS).map(|n| n.to_string()).collect();
        Box::leak(all.into_boxed_str())
    });
    // Where `n` starts: after every shorter number, then its own digits' worth of those
    // of its length before it.
    let (start, len) = match n {
        0..=9 => (n, 1),
        10..=99 => (10 + (n - 10) * 2, 2),
        100..=999 => (190 + (n - 100) * 3, 3),
        _ => (2890 + (n - 1000) * 4, 4),
    };
    let start = start as usize;
    &all[start..start + len]
}

/// Writes a remaining budget as a `grpc-timeout` value in milliseconds (`<n>m`).
pub fn format_grpc_ms(remaining: Duration, buf: &mut [u8; 20]) -> &[u8] {
    // 8 digits of milliseconds is ~27 hours, plenty; clamp rather than overflow the format.
    let ms = (remaining.as_millis() as u64).clamp(1, 99_999_999);
    let len = format_u64(ms, buf).len();
    buf[len] = b'm';
    &buf[..=len]
}

fn format_u64(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    let len = tmp.len() - i;
    buf[..len].copy_from_slice(&tmp[i..]);
    &buf[..len]
}

#[cfg(test)]
mod tests;

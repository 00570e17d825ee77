//! The `Content-Length: 5,5` rewrite on the caller's socket
//! (`proxy/src/server/caller_io.rs`): in the first read of a request head, a
//! `Content-Length` whose value is a list of equal numbers keeps one; the rest is blanked.
//!
//! The input is the bytes a caller sends; its first byte is where the first read ends (the
//! rest arrives in later reads, which are not rewritten). hyper's view of a head is modelled
//! with httparse, which hyper parses with, and hyper's rule for `Content-Length` (every
//! value all digits, all values equal).
//!
//! Properties (framing stays consistent): the rewrite only blanks bytes; when hyper accepts
//! the rewritten bytes, it also parses the original as a head of the same length with the
//! same headers (only `Content-Length` values differ), the original's `Content-Length`
//! under RFC 9110's list rule is the length hyper now frames the body with, and not a byte
//! after the head (body, pipelined requests) changed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_proxy::fuzzing::collapse_content_length;

/// hyper's default header limit for HTTP/1.
const MAX_HEADERS: usize = 100;

fuzz_target!(|input: &[u8]| {
    let Some((&split, sent)) = input.split_first() else { return };
    check(sent, sent.len());
    check(sent, usize::from(split).min(sent.len()));
});

fn check(sent: &[u8], first_read: usize) {
    let mut rewritten = sent.to_vec();
    collapse_content_length(&mut rewritten[..first_read]);
    for (i, (&before, &after)) in sent.iter().zip(&rewritten).enumerate() {
        assert!(before == after || after == b' ', "byte {i} became {after:?}, not a blank");
    }
    if rewritten == sent {
        return;
    }
    if let Some((_, headers)) = parse(sent) {
        let accepted = hyper_content_length(&headers).is_ok();
        assert!(!accepted, "rewrote a head hyper accepts as it is: {sent:?}");
    }
    // What hyper does with the rewritten bytes.
    let Some((head_len, headers)) = parse(&rewritten) else { return };
    let Ok(length) = hyper_content_length(&headers) else { return };
    // hyper accepts them: the original must mean exactly that.
    let (original_len, original) =
        parse(sent).unwrap_or_else(|| panic!("the rewrite made a head of {sent:?}"));
    assert_eq!(original_len, head_len, "the head's length changed");
    assert_eq!(&sent[head_len..], &rewritten[head_len..], "bytes after the head changed");
    assert_eq!(original.len(), headers.len(), "the header count changed");
    for ((name, before), (new_name, after)) in original.iter().zip(&headers) {
        assert_eq!(name, new_name);
        if !name.eq_ignore_ascii_case("content-length") {
            assert_eq!(before, after, "{name} changed");
        }
    }
    assert_eq!(list_content_length(&original), Ok(length), "the body's length changed");
}

type Headers = Vec<(String, Vec<u8>)>;

/// httparse's verdict, as hyper's server gets it: the head's length and its headers.
fn parse(bytes: &[u8]) -> Option<(usize, Headers)> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(bytes) {
        Ok(httparse::Status::Complete(len)) => Some((
            len,
            request.headers.iter().map(|h| (h.name.to_owned(), h.value.to_vec())).collect(),
        )),
        _ => None,
    }
}

fn content_lengths(headers: &Headers) -> impl Iterator<Item = &[u8]> {
    headers
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.as_slice())
}

/// How the body is framed by `Content-Length`: `Ok(None)` without one, `Err` when invalid.
type Framing = Result<Option<u64>, ()>;

/// hyper: every value is one decimal number, and all are equal.
fn hyper_content_length(headers: &Headers) -> Framing {
    all_equal(content_lengths(headers).map(decimal))
}

/// RFC 9110 section 8.6: a value may also be a list of equal numbers.
fn list_content_length(headers: &Headers) -> Framing {
    all_equal(
        content_lengths(headers).flat_map(|v| {
            v.split(|&b| b == b',').map(|p| decimal(trim_ows(p))).collect::<Vec<_>>()
        }),
    )
}

fn all_equal(mut values: impl Iterator<Item = Option<u64>>) -> Framing {
    let Some(first) = values.next() else { return Ok(None) };
    let first = first.ok_or(())?;
    if values.all(|v| v == Some(first)) {
        Ok(Some(first))
    } else {
        Err(())
    }
}

fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

fn decimal(v: &[u8]) -> Option<u64> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

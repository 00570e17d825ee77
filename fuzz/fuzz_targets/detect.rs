//! Protocol detection on the first bytes of a connection (`proxy/src/server/detect.rs`):
//! HTTP/1.1 or h2c prior knowledge, by peeking.
//!
//! The input is what a caller sends; its first byte says how the peeks split it (each peek
//! sees everything that arrived so far, as the socket's `peek` does, up to the 24 bytes of
//! the preface the listener peeks into).
//!
//! Properties: detection never decides before it has the bytes it needs (while what arrived
//! is a strict prefix of the preface it waits); it answers h2 exactly for the whole preface
//! and HTTP/1.1 exactly when a byte differs from it; a verdict never changes as more bytes
//! arrive; it accepts any length (more than 24 bytes included) without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_proxy::fuzzing::{detect_protocol, Detected, H2_PREFACE};

fuzz_target!(|input: &[u8]| {
    let Some((&split, sent)) = input.split_first() else { return };
    // Arrival sizes: 1..=8 bytes at a time, from the split byte's bits.
    let step = usize::from(split % 8) + 1;
    let mut verdict = None;
    let mut arrived = 0;
    while arrived < sent.len() {
        arrived = (arrived + step).min(sent.len());
        let peeked = &sent[..arrived.min(H2_PREFACE.len())];
        let now = detect_protocol(peeked);
        let prefix = H2_PREFACE.starts_with(peeked);
        match now {
            None => assert!(prefix && peeked.len() < H2_PREFACE.len(), "waits on {peeked:?}"),
            Some(Detected::H2) => assert_eq!(peeked, &H2_PREFACE[..]),
            Some(Detected::Http1) => assert!(!prefix, "decided HTTP/1.1 on {peeked:?}"),
        }
        if let Some(before) = verdict {
            assert_eq!(now, Some(before), "changed its mind at {arrived} bytes");
        }
        verdict = now;
        // Any longer buffer (a caller of the function with a bigger peek) gets the verdict
        // of its first 24 bytes.
        assert_eq!(detect_protocol(&sent[..arrived]), verdict.or(detect_protocol(peeked)));
    }
});

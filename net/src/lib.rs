//! weir-net: what every weir listener shares, below every crate that listens (the proxy's
//! inbound and egress roles, the control API, the injection webhook, the workload's test
//! app), so none of them keeps a copy of its own:
//!
//! - [`accept`]: the one bounded accept loop: at most `max_connections` at once (a
//!   connection beyond that is closed at once: the peer sees a reset, not a hang), a
//!   growing back-off after failed accepts (out of file descriptors), and a stop that is a
//!   future, not a flag polled;
//! - [`drain`]: drain as an event: a signal every connection hears at once, and a count of
//!   the work still inside that the owner can await ("the last request finished") instead
//!   of polling a counter.
//!
//! What a connection does once accepted (protocol detection, TLS, hyper) is each server's
//! own: the proxy's connection driver needs the proxy's body types, the webhook speaks TLS,
//! the control API a plain hyper connection.

pub mod accept;
pub mod drain;

pub use accept::{accept_loop, Accepted, ConnectionPermit, Serve};

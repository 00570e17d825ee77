//! The server skeleton both roles run on (docs/design.md, "Server skeleton"): the inbound
//! role ([`crate::service::Inbound`]) and the egress role ([`crate::egress`]) are two
//! [`Role`]s, that is two policies for a request; everything about connections is here,
//! once:
//!
//! - accepting: [`weir_net::accept_loop`], the workspace's one bounded accept loop (at most
//!   `max_connections` at once, beyond that a new connection is closed at once; a growing
//!   back-off after failed accepts), until the drain starts;
//! - each connection ([`conn`]): HTTP/1.1 or h2c prior knowledge told apart within
//!   `timeouts.header_read` ([`detect`]), the socket behind [`CallerIo`] (a write that
//!   makes no progress for `timeouts.write` ends the connection; one `Content-Length`;
//!   the role's level on hyper's own error responses), each h2 stream guarded against a
//!   caller that stops reading ([`h2_streams`]), HTTP/1.1 dropped when a complete request
//!   head takes longer than `timeouts.header_read` after the previous exchange (the
//!   driver's one timer per connection, not one per head: `server/activity.rs`), closed
//!   after `timeouts.idle` without a request inside, and, once the drain starts (an event: [`weir_net::drain`]), asked to
//!   finish what it has (HTTP/1.1: the request in progress; h2: GOAWAY, then the open
//!   streams). A connection asked to close is dropped once it has had nothing inside (no
//!   request, no response body still streaming) for `timeouts.graceful_close`: h2's
//!   graceful close waits for the peer to acknowledge a PING, and a peer that never does
//!   would otherwise keep the connection, and its place, for ever. The driver's timer and
//!   drain watch are polled when they fire, not on each of the connection's wake-ups
//!   ([`flagged`]);
//! - each request's budget timer (its wait for the app) is the connection's, lent to one
//!   request at a time and moved to its deadline ([`budget_timer`]): no timer-wheel insert
//!   and removal per request.
//!
//! [`CallerIo`]: caller_io::CallerIo

use std::future::Future;
use std::sync::Arc;

use http::{HeaderName, HeaderValue, Request, Response};
use hyper::body::Incoming;
use tokio::net::TcpListener;
use weir_net::drain::Watch;

use crate::body::ResponseBody;
use crate::config::ServerConfig;

mod activity;
pub(crate) mod budget_timer;
pub(crate) mod caller_io;
mod conn;
pub(crate) mod detect;
mod flagged;
mod h2_streams;

/// What a role answers hyper's own error responses with (HTTP/1.1: hyper writes a canned
/// `400` straight to the socket for a request it cannot parse): the level header every
/// response of the role carries.
pub(crate) trait LevelStamp: Send + Sync + 'static {
    fn level_header(&self) -> (&HeaderName, HeaderValue);
}

/// A policy for requests: what the skeleton calls for each one.
pub(crate) trait Role: LevelStamp {
    /// What the role keeps per connection (`Default` at accept).
    type Conn: Default + Send + Sync + 'static;

    /// Answers one request; never fails (every problem is a response).
    fn serve(
        self: Arc<Self>,
        conn: Arc<Self::Conn>,
        req: Request<Incoming>,
    ) -> impl Future<Output = Response<ResponseBody>> + Send + 'static;
}

/// Serves `role` on `listener` until `drain` is signalled: accepting then stops (the
/// listener is dropped) and every connection is asked to finish. `name` names the listener
/// in the log.
pub(crate) async fn serve<R: Role>(
    listener: TcpListener,
    name: &'static str,
    role: Arc<R>,
    config: Arc<ServerConfig>,
    drain: Watch,
) {
    let stop = drain.signaled();
    let max_connections = config.max_connections;
    weir_net::accept_loop(listener, name, max_connections, stop, |accepted: weir_net::Accepted| {
        let conn = conn::Connection::new(role.clone(), config.clone(), drain.clone());
        tokio::spawn(conn.serve(accepted.stream, accepted.permit));
    })
    .await
}

#[cfg(test)]
mod tests;

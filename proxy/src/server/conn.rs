//! The connection driver, one for both roles: detection, the socket behind `CallerIo`,
//! hyper's HTTP/1.1 or h2 server, and the three ways a connection is asked to end (idle,
//! drain) or is dropped (a graceful close that does not finish). See [`super`].

use std::convert::Infallible;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulConnection;
use tokio::net::TcpStream;
use tokio::time::Instant;
use weir_net::drain::Watch;
use weir_net::ConnectionPermit;

use super::activity::{Activity, Busy};
use super::caller_io::CallerIo;
use super::detect::{self, Detected};
use super::flagged::Flagged;
use super::h2_streams::StreamExecutor;
use super::{LevelStamp, Role};
use crate::config::ServerConfig;

/// One accepted connection of a role.
pub(super) struct Connection<R: Role> {
    role: Arc<R>,
    config: Arc<ServerConfig>,
    drain: Watch,
}

// === impl Connection ===

impl<R: Role> Connection<R> {
    pub(super) fn new(role: Arc<R>, config: Arc<ServerConfig>, drain: Watch) -> Self {
        Connection { role, config, drain }
    }

    /// Serves the connection to its end; `permit` (its place among `max_connections`) is
    /// held until then.
    pub(super) async fn serve(self, stream: TcpStream, permit: ConnectionPermit) {
        let _permit = permit;
        let timeouts = &self.config.timeouts;
        let detect_by = Instant::now() + timeouts.header_read;
        let detected = match detect::protocol(&stream, detect_by).await {
            Ok(Some(detected)) => detected,
            // Closed, failed, or nothing decisive within `header_read`.
            Ok(None) | Err(_) => return,
        };
        let activity = Arc::new(Activity::new());
        // HTTP/1.1 takes a whole body (weir holds all of it) into its write buffer in the
        // poll that writes the head: it is never sent after the request stops counting busy,
        // so it needs no streaming count (a write the caller blocks is `CallerIo`'s to tell).
        // h2 may hold it back for flow control.
        let whole_bodies_at_once = matches!(detected, Detected::Http1);
        let service = {
            let (role, activity) = (self.role.clone(), activity.clone());
            let conn = Arc::new(R::Conn::default());
            service_fn(move |req| {
                // Boxed: the role's future is large, and hyper moves the service's future
                // a few times per request; a pointer is cheaper to move than its state.
                let served = Box::pin(role.clone().serve(conn.clone(), req));
                let activity = activity.clone();
                async move {
                    let busy = Busy::new(&activity);
                    let mut response = served.await;
                    activity.expect_head();
                    // Counted streaming before it stops counting busy: the driver never
                    // sees the connection empty while a body is about to be sent.
                    let body = response.body();
                    let sent_at_once = whole_bodies_at_once && body.is_whole();
                    if !sent_at_once && !hyper::body::Body::is_end_stream(body) {
                        activity.streaming_started();
                        response.body_mut().hold(activity.clone());
                    }
                    drop(busy);
                    Ok::<_, Infallible>(response)
                }
            })
        };
        let write = timeouts.write;
        match detected {
            Detected::Http1 => {
                let stamp: Arc<dyn LevelStamp> = self.role.clone();
                let io = TokioIo::new(CallerIo::http1(stream, write, stamp, activity.clone()));
                // The header-read timeout is the driver's (see `Activity`): hyper's own
                // would arm a timer for every request head.
                let conn = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(None)
                    .serve_connection(io, service);
                self.drive(conn, &activity, Some(timeouts.header_read)).await;
            }
            Detected::H2 => {
                let io = TokioIo::new(CallerIo::h2(stream, write));
                let conn = http2::Builder::new(StreamExecutor { write })
                    .timer(TokioTimer::new())
                    .max_concurrent_streams(self.config.h2.max_concurrent_streams)
                    .serve_connection(io, service);
                self.drive(conn, &activity, None).await;
            }
        }
    }

    /// Runs the connection to its end, asking it to finish gracefully when it has been idle
    /// for `timeouts.idle` or the drain starts, and dropping it when that has not finished
    /// after `timeouts.graceful_close` with nothing inside. With `header_read` (HTTP/1.1),
    /// a connection that has waited that long for a complete request head is dropped, as
    /// hyper's own header-read timeout would.
    async fn drive<C>(&self, conn: C, activity: &Activity, header_read: Option<Duration>)
    where
        C: GracefulConnection,
        C::Error: std::fmt::Display,
    {
        let (idle, graceful_close) =
            (self.config.timeouts.idle, self.config.timeouts.graceful_close);
        let mut conn = pin!(conn);
        let first = header_read.map_or(idle, |h| h.min(idle));
        // Flagged: polled when they fire, not on each of the connection's wake-ups (two per
        // HTTP/1.1 request), which would register the task with each again every time.
        let mut timer = Flagged::new(Box::pin(tokio::time::sleep(first)));
        let mut drained = Flagged::new(Box::pin(self.drain.signaled()));
        let mut closing = false;
        loop {
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "connection ended");
                    }
                    return;
                }
                () = &mut timer => {
                    let now = Instant::now();
                    if closing {
                        // Asked to close at least `graceful_close` ago: done if nothing is
                        // inside; otherwise what is inside has its own bounds, look again.
                        if activity.idle_deadline(idle).is_some() && activity.none_streaming() {
                            tracing::debug!(
                                "connection dropped: its graceful close did not finish \
                                 within timeouts.graceful_close"
                            );
                            return;
                        }
                        timer.get_mut().as_mut().reset(now + graceful_close);
                        continue;
                    }
                    let head_at = header_read.and_then(|h| activity.head_deadline(h));
                    if head_at.is_some_and(|at| at <= now) {
                        tracing::debug!(
                            "connection dropped: no complete request head within \
                             timeouts.header_read"
                        );
                        return;
                    }
                    // While something is inside or being sent, look again within the
                    // shorter timeout: the wait for a head may start any time.
                    let again = now + header_read.map_or(idle, |h| h.min(idle));
                    let next = head_at.unwrap_or(again);
                    match activity.idle_deadline(idle) {
                        Some(at) if at <= now => {
                            conn.as_mut().graceful_shutdown();
                            closing = true;
                            timer.get_mut().as_mut().reset(now + graceful_close);
                        }
                        Some(at) => timer.get_mut().as_mut().reset(at.min(next)),
                        None => timer.get_mut().as_mut().reset(next),
                    }
                }
                () = &mut drained, if !closing => {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                    timer.get_mut().as_mut().reset(Instant::now() + graceful_close);
                }
            }
        }
    }
}

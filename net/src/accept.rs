//! The one bounded accept loop (see the crate's documentation).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The first wait after a failed accept; each further failure in a row doubles it.
const FIRST_BACKOFF: Duration = Duration::from_millis(5);
/// The longest wait between two tries: out of file descriptors lasts until connections
/// close, and retrying faster only spins (and floods the log).
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// A connection accepted within the bound.
#[derive(Debug)]
pub struct Accepted {
    /// With `TCP_NODELAY` set: every weir server answers request by request.
    pub stream: TcpStream,
    pub peer: SocketAddr,
    /// Its place among `max_connections`: hold it until the connection ends.
    pub permit: ConnectionPermit,
}

/// One of the `max_connections` places; the place is free again when this is dropped.
#[derive(Debug)]
pub struct ConnectionPermit(#[allow(dead_code)] OwnedSemaphorePermit);

/// What the loop does with what it accepts. Any `FnMut(Accepted)` is one.
pub trait Serve {
    /// Serves `conn` (spawns the task that holds `conn.permit` until the connection ends).
    fn serve(&mut self, conn: Accepted);

    /// A connection from `peer` came while `max_connections` were open; it is closed right
    /// after this returns. For counting.
    fn refused(&mut self, peer: SocketAddr) {
        let _ = peer;
    }
}

impl<F: FnMut(Accepted)> Serve for F {
    fn serve(&mut self, conn: Accepted) {
        self(conn)
    }
}

/// Accepts on `listener` until `stop` resolves, then returns (dropping the listener, so new
/// connections are refused by the kernel). At most `max_connections` accepted connections
/// are open at once; beyond that a new one is reported to [`Serve::refused`] and closed at
/// once. `name` names the listener in the log.
pub async fn accept_loop(
    listener: TcpListener,
    name: &'static str,
    max_connections: usize,
    stop: impl Future<Output = ()>,
    mut serve: impl Serve,
) {
    let permits = Arc::new(Semaphore::new(max_connections.min(Semaphore::MAX_PERMITS)));
    let mut stop = pin!(stop);
    let mut backoff = Backoff::default();
    loop {
        let accepted = tokio::select! {
            biased;
            () = stop.as_mut() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => {
                backoff.reset();
                accepted
            }
            Err(e) => {
                let wait = backoff.failed();
                tracing::warn!(error = %e, listener = name, retry_in = ?wait, "accept failed");
                tokio::select! {
                    biased;
                    () = stop.as_mut() => return,
                    () = tokio::time::sleep(wait) => continue,
                }
            }
        };
        match permits.clone().try_acquire_owned() {
            Ok(permit) => {
                let _ = stream.set_nodelay(true);
                serve.serve(Accepted { stream, peer, permit: ConnectionPermit(permit) });
            }
            Err(_) => {
                // Counted before the peer can see the close.
                serve.refused(peer);
                drop(stream);
            }
        }
    }
}

/// The wait before the next accept after failures in a row.
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { next: FIRST_BACKOFF }
    }
}

impl Backoff {
    /// One more failure: how long to wait now.
    fn failed(&mut self) -> Duration {
        let wait = self.next;
        self.next = (wait * 2).min(MAX_BACKOFF);
        wait
    }

    fn reset(&mut self) {
        self.next = FIRST_BACKOFF;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    use tokio::io::AsyncReadExt;

    #[test]
    fn the_backoff_doubles_to_its_cap_and_resets() {
        let mut b = Backoff::default();
        let waits: Vec<_> = (0..10).map(|_| b.failed()).collect();
        assert_eq!(waits[0], FIRST_BACKOFF);
        assert_eq!(waits[1], FIRST_BACKOFF * 2);
        assert!(waits.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(*waits.last().unwrap(), MAX_BACKOFF);
        b.reset();
        assert_eq!(b.failed(), FIRST_BACKOFF);
    }

    /// One connection open at a time: the second is closed at once and reported, the third
    /// (after the first ended) is served; the stop ends the loop and drops the listener.
    #[tokio::test]
    async fn beyond_max_connections_a_connection_is_closed_and_the_stop_ends_the_loop() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (conns_tx, mut conns) = tokio::sync::mpsc::unbounded_channel();
        let refused = Arc::new(AtomicUsize::new(0));
        struct Server(tokio::sync::mpsc::UnboundedSender<Accepted>, Arc<AtomicUsize>);
        impl Serve for Server {
            fn serve(&mut self, conn: Accepted) {
                let _ = self.0.send(conn);
            }
            fn refused(&mut self, _peer: SocketAddr) {
                self.1.fetch_add(1, Relaxed);
            }
        }
        let server = Server(conns_tx, refused.clone());
        let stop = async {
            let _ = stop_rx.await;
        };
        let looping = tokio::spawn(accept_loop(listener, "test", 1, stop, server));

        let _first = TcpStream::connect(addr).await.unwrap();
        let served = conns.recv().await.unwrap();
        assert!(served.stream.nodelay().unwrap());
        let mut second = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(10), second.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0) | Err(_))), "closed at once: {read:?}");
        assert_eq!(refused.load(Relaxed), 1);

        drop(served);
        let _third = TcpStream::connect(addr).await.unwrap();
        assert!(conns.recv().await.is_some(), "served once the first one's place was free");

        stop_tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), looping).await.unwrap().unwrap();
        assert!(TcpStream::connect(addr).await.is_err(), "the listener is gone");
    }
}

//! Connections open per peer address, so one host cannot take every connection slot.
//!
//! The API server reaches the webhook from a few addresses (one per API server, or its
//! egress proxy's) over a handful of HTTP/2 connections; a host that opens hundreds of idle
//! TCP connections is not an API server. Without a per-peer bound, 1,100 idle connections
//! from one host filled `--max-connections` (1,024) and every review failed until their
//! handshakes timed out.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Open connections by peer IP (IPv4-mapped IPv6 counted as IPv4). An entry lives only while
/// its peer has a connection open, so the map holds at most `--max-connections` entries.
#[derive(Debug, Default)]
pub(crate) struct PeerConnections {
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One open connection of a peer; dropping it closes the count.
#[derive(Debug)]
pub(crate) struct PeerSlot {
    peers: Arc<PeerConnections>,
    ip: IpAddr,
}

impl PeerConnections {
    /// A slot for one more connection from `ip`, unless it already has `max` open.
    pub(crate) fn enter(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<PeerSlot> {
        let ip = ip.to_canonical();
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(PeerSlot { peers: self.clone(), ip })
    }

    #[cfg(test)]
    fn open(&self, ip: IpAddr) -> usize {
        self.open.lock().unwrap().get(&ip).copied().unwrap_or(0)
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_peer_gets_at_most_max_and_a_closed_one_frees_its_slot() {
        let peers = Arc::new(PeerConnections::default());
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = peers.enter(a, 2).unwrap();
        let _second = peers.enter(mapped, 2).expect("the same host, counted once");
        assert!(peers.enter(a, 2).is_none(), "a third from the same host");
        assert!(peers.enter(b, 2).is_some(), "another host is not affected");
        drop(first);
        assert_eq!(peers.open(a), 1);
        let third = peers.enter(a, 2).expect("a slot freed");
        drop(third);
        drop(_second);
        assert!(peers.open.lock().unwrap().is_empty(), "no entry without a connection");
    }
}

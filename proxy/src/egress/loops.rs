//! Loop prevention (docs/design.md, "Roles", egress): the egress never sends a request to
//! this sidecar's own listeners, and never forwards a request that has already passed
//! through it.
//!
//! Without this, a request addressed to the egress itself (`GET http://127.0.0.1:15002/`)
//! is forwarded to itself, which forwards it again, one new connection per hop, until the
//! budget runs out: `deadline_margin` per hop, so ~50 connections for the default 500 ms and
//! tens of thousands of file descriptors for a caller that grants itself minutes.
//!
//! Two independent checks, both before anything is sent:
//! - [`OwnListeners`]: the resolved downstream address against every listener of this
//!   process (inbound, egress and its routes, admin, public). A listener bound to the
//!   unspecified address (`0.0.0.0`, `[::]`) is reached through every address of this host:
//!   loopback, the pod IP, any other interface; a destination of `0.0.0.0` reaches the host
//!   itself. `localhost` names are caught after resolution.
//! - [`ViaTag`]: every forwarded request carries `Via: <protocol> <pseudonym>` (RFC 9110
//!   7.6.3), the pseudonym random per process; a request arriving with it has looped back
//!   (through a name, a NAT or another proxy the address check cannot see).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;

use http::header::VIA;
use http::{HeaderMap, HeaderValue, Version};

/// Addresses whose locality is remembered (a pod's addresses do not change); beyond that,
/// the kernel is asked each time (one `bind` on a UDP socket, a few microseconds).
const MAX_REMEMBERED_IPS: usize = 1024;

/// This process's listening addresses, and which destination addresses reach them.
#[derive(Debug)]
pub struct OwnListeners {
    listeners: Vec<SocketAddr>,
    is_local: fn(IpAddr) -> bool,
    remembered: Mutex<HashMap<IpAddr, bool>>,
}

impl OwnListeners {
    /// `listeners` as bound (port 0, an address not yet bound, is skipped).
    pub fn new(listeners: impl IntoIterator<Item = SocketAddr>) -> Self {
        Self::with_probe(listeners, address_of_this_host)
    }

    /// As [`OwnListeners::new`], with `is_local` deciding whether an address belongs to
    /// this host (tests).
    pub fn with_probe(
        listeners: impl IntoIterator<Item = SocketAddr>,
        is_local: fn(IpAddr) -> bool,
    ) -> Self {
        let mut listeners: Vec<SocketAddr> = listeners
            .into_iter()
            .filter(|a| a.port() != 0)
            .map(|a| SocketAddr::new(a.ip().to_canonical(), a.port()))
            .collect();
        listeners.sort_unstable();
        listeners.dedup();
        OwnListeners { listeners, is_local, remembered: Mutex::new(HashMap::new()) }
    }

    pub fn listeners(&self) -> &[SocketAddr] {
        &self.listeners
    }

    /// The listener of ours a connection to `target` would reach, if any.
    pub fn reached_by(&self, target: SocketAddr) -> Option<SocketAddr> {
        let ip = target.ip().to_canonical();
        let mut same_port = self.listeners.iter().filter(|l| l.port() == target.port()).peekable();
        same_port.peek()?;
        // Connecting to the unspecified address reaches this host.
        if ip.is_unspecified() {
            return same_port.next().copied();
        }
        let mut local = None;
        same_port
            .find(|l| {
                l.ip() == ip
                    || (l.ip().is_unspecified() && *local.get_or_insert_with(|| self.local(ip)))
            })
            .copied()
    }

    fn local(&self, ip: IpAddr) -> bool {
        if ip.is_loopback() {
            return true;
        }
        let mut remembered = self.remembered.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&known) = remembered.get(&ip) {
            return known;
        }
        let local = (self.is_local)(ip);
        if remembered.len() < MAX_REMEMBERED_IPS {
            remembered.insert(ip, local);
        }
        local
    }
}

/// Whether `ip` is an address of this host: the kernel lets a socket bind only to those.
fn address_of_this_host(ip: IpAddr) -> bool {
    ip.is_loopback()
        || ip.is_unspecified()
        || std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// This egress's entry in `Via`: added to every forwarded request, recognised on arrival.
#[derive(Debug, Clone)]
pub struct ViaTag {
    pseudonym: String,
    http1: HeaderValue,
    http2: HeaderValue,
    http10: HeaderValue,
}

impl ViaTag {
    /// A pseudonym no other process shares: `weir-` and 64 random bits. It says nothing
    /// about the pod (RFC 9110 7.6.3 allows a pseudonym for the received-by host).
    pub fn random() -> Self {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        if let Ok(since) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            hasher.write_u128(since.as_nanos());
        }
        Self::new(&format!("weir-{:016x}", hasher.finish()))
    }

    /// `pseudonym` must be a header token (letters, digits, `-`).
    pub fn new(pseudonym: &str) -> Self {
        let value = |protocol: &str| {
            HeaderValue::from_str(&format!("{protocol} {pseudonym}"))
                .unwrap_or_else(|_| HeaderValue::from_static("1.1 weir"))
        };
        ViaTag {
            pseudonym: pseudonym.to_owned(),
            http1: value("1.1"),
            http2: value("2"),
            http10: value("1.0"),
        }
    }

    pub fn pseudonym(&self) -> &str {
        &self.pseudonym
    }

    /// Whether any `Via` entry was received by this egress (`[protocol/]version received-by
    /// [comment]`, comma-separated, over any number of header lines).
    pub fn seen_in(&self, headers: &HeaderMap) -> bool {
        headers.get_all(VIA).iter().any(|value| {
            value.as_bytes().split(|&b| b == b',').any(|entry| {
                let mut parts = entry.split(u8::is_ascii_whitespace).filter(|p| !p.is_empty());
                let _protocol = parts.next();
                parts.next().is_some_and(|by| by.eq_ignore_ascii_case(self.pseudonym.as_bytes()))
            })
        })
    }

    /// Appends this egress's entry, naming the protocol the request was `received` with.
    pub fn stamp(&self, headers: &mut HeaderMap, received: Version) {
        let value = match received {
            Version::HTTP_2 => &self.http2,
            Version::HTTP_10 => &self.http10,
            _ => &self.http1,
        };
        headers.append(VIA, value.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// This "host" owns 127.0.0.0/8, ::1 and 10.1.2.3 (its pod IP).
    fn pod_host(ip: IpAddr) -> bool {
        ip.is_loopback() || ip == "10.1.2.3".parse::<IpAddr>().unwrap()
    }

    #[test]
    fn a_destination_reaching_any_listener_is_ours() {
        let own = OwnListeners::with_probe(
            [
                addr("0.0.0.0:15001"),
                addr("127.0.0.1:15000"),
                addr("127.0.0.1:15002"),
                addr("[::]:15020"),
                addr("127.0.0.1:0"),
            ],
            pod_host,
        );
        assert_eq!(own.listeners().len(), 4, "port 0 is not a listener");
        // The inbound listener on every address: loopback, pod IP, 0.0.0.0, v4-mapped.
        for target in [
            "127.0.0.1:15001",
            "127.9.9.9:15001",
            "10.1.2.3:15001",
            "0.0.0.0:15001",
            "[::ffff:10.1.2.3]:15001",
        ] {
            assert_eq!(own.reached_by(addr(target)), Some(addr("0.0.0.0:15001")), "{target}");
        }
        // Loopback-bound listeners: only through their own address (and 0.0.0.0).
        assert_eq!(own.reached_by(addr("127.0.0.1:15002")), Some(addr("127.0.0.1:15002")));
        assert_eq!(own.reached_by(addr("0.0.0.0:15000")), Some(addr("127.0.0.1:15000")));
        assert_eq!(own.reached_by(addr("[::]:15000")), Some(addr("127.0.0.1:15000")));
        assert_eq!(own.reached_by(addr("10.1.2.3:15002")), None);
        assert_eq!(own.reached_by(addr("[::1]:15020")), Some(addr("[::]:15020")));
        // Other hosts, other ports.
        assert_eq!(own.reached_by(addr("10.1.2.4:15001")), None, "another pod's sidecar");
        assert_eq!(own.reached_by(addr("127.0.0.1:8080")), None);
        assert_eq!(own.reached_by(addr("10.1.2.3:80")), None);
    }

    #[test]
    fn the_real_probe_knows_loopback_and_not_a_documentation_address() {
        assert!(address_of_this_host("127.0.0.1".parse().unwrap()));
        assert!(!address_of_this_host("192.0.2.1".parse().unwrap()), "TEST-NET-1");
        let own = OwnListeners::new([addr("0.0.0.0:15001")]);
        assert!(own.reached_by(addr("127.0.0.1:15001")).is_some());
        assert!(own.reached_by(addr("192.0.2.1:15001")).is_none());
    }

    #[test]
    fn via_is_appended_and_recognised_among_others() {
        let tag = ViaTag::new("weir-00aa");
        let other = ViaTag::random();
        assert!(other.pseudonym().starts_with("weir-") && other.pseudonym() != "weir-00aa");
        let mut h = HeaderMap::new();
        assert!(!tag.seen_in(&h));
        h.append(VIA, HeaderValue::from_static("1.0 fred, 1.1 p.example.net (Apache/1.1)"));
        other.stamp(&mut h, Version::HTTP_2);
        assert!(!tag.seen_in(&h));
        assert!(other.seen_in(&h));
        tag.stamp(&mut h, Version::HTTP_11);
        assert!(tag.seen_in(&h));
        let values: Vec<_> = h.get_all(VIA).iter().map(|v| v.to_str().unwrap()).collect();
        assert_eq!(values[1..], [format!("2 {}", other.pseudonym()), "1.1 weir-00aa".into()]);
        // Inside a list, any case, with a comment, with odd spacing.
        let mut h = HeaderMap::new();
        h.insert(VIA, HeaderValue::from_static("1.1 a,HTTP/2   WEIR-00AA  (weir),1.1 b"));
        assert!(tag.seen_in(&h));
        // A protocol name alone, or the pseudonym as a comment, is not an entry of ours.
        h.insert(VIA, HeaderValue::from_static("weir-00aa, 1.1 x (weir-00aa)"));
        assert!(!tag.seen_in(&h));
    }
}

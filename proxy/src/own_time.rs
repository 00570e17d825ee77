//! The app's own time: its response time less what it spent waiting on its downstreams.
//!
//! A middle hop's app answers as slowly as its downstreams do. The adaptive in-flight limit
//! must see only the app's own work, or it would queue (and shed) here for someone else's
//! overload. With the egress role on, weir sees both sides of the hop: the inbound requests
//! it hands the app, and the outbound calls the app makes through the egress while serving
//! them. They are paired by the request's correlation key, which apps already forward for
//! tracing:
//!
//! 1. the trace id of a W3C `traceparent` (`00-<trace id>-<span id>-<flags>`: an app that
//!    traces makes a child span, so the span id changes and the trace id does not);
//! 2. else `x-request-id` (Envoy's convention; what most meshes' apps forward);
//! 3. else `x-b3-traceid` (Zipkin B3).
//!
//! An inbound request carrying none gets an `x-request-id` stamped on its way to the app
//! (as Envoy does), so an app that forwards it is paired too.
//!
//! While at least one call made under a key is in flight, the inbound request(s) of that
//! key wait on a downstream: each lends its in-flight slot (the limit bounds what the app
//! works on, within `max_inflight`), and the span is added to the request's downstream
//! time, which [`Visit::end`] takes off its response time. Several inbound requests may
//! share a key (one trace calling this service twice at once): a call is then taken as
//! blocking one of them, at most as many as there are calls. A call whose key no inbound
//! request holds (the app forwards nothing, or calls on its own) is only counted
//! (`weir_egress_calls_unpaired_total`): the limit then sees the whole response time, and
//! its cut-as-experiment (a latency that does not fall with concurrency is undone) keeps
//! it from shedding for the downstream.
//!
//! Only with the egress role on; otherwise nothing here runs. Cost: one hash of a short
//! header and a lock on one of 16 shards per inbound request and per outbound call.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::inflight::InflightLimit;
use crate::route_level::RouteState;

/// The trace context header (W3C Trace Context).
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// The request id header weir reads, and stamps when a request carries no key.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// Zipkin B3's trace id.
pub const B3_TRACE_ID: HeaderName = HeaderName::from_static("x-b3-traceid");

const SHARDS: usize = 16;

/// Inbound requests at the app and outbound calls in flight, paired by key.
pub struct DownstreamWaits {
    limit: Arc<InflightLimit>,
    shards: Box<[Mutex<HashMap<u64, Entry>>]>,
    hasher: std::collections::hash_map::RandomState,
    /// Stamped `x-request-id`s: a per-process random prefix and a counter.
    prefix: u64,
    next_id: AtomicU64,
    paired: AtomicU64,
    unpaired: AtomicU64,
    /// Per-route levels, which learn from the same pairing (see [`crate::route_level`]).
    routes: Option<Arc<RouteState>>,
}

/// One key's inbound requests and calls.
#[derive(Debug, Default)]
struct Entry {
    /// Inbound requests with this key at the app.
    inbound: u32,
    /// Outbound calls with this key in flight.
    calls: u32,
    /// Slots lent for this key: `min(inbound, calls)`.
    lent: u32,
    /// Since when a call has been in flight, and the time with calls in flight before that.
    blocked_since: Option<Instant>,
    waited: Duration,
    /// The route of the latest inbound request with this key.
    route: Option<Arc<str>>,
    /// That request is the door's probe (per-route levels): its calls go out.
    probe: bool,
}

impl Entry {
    /// Time with calls in flight up to `now`.
    fn waited_until(&self, now: Instant) -> Duration {
        self.waited
            + self.blocked_since.map_or(Duration::ZERO, |s| now.saturating_duration_since(s))
    }

    /// Lends or returns slots so that `lent == min(inbound, calls)`.
    fn settle_lending(&mut self, limit: &InflightLimit) {
        let want = self.inbound.min(self.calls);
        while self.lent < want {
            self.lent += 1;
            limit.lend();
        }
        while self.lent > want {
            self.lent -= 1;
            limit.unlend();
        }
    }
}

/// An inbound request at the app, registered under its key.
#[derive(Debug)]
pub struct Visit {
    key: u64,
    /// The key's waited time when the request arrived.
    waited_before: Duration,
    /// When it went to the app.
    start: Instant,
}

/// An outbound call in flight; ends (and stops the wait) on drop.
pub struct Call {
    waits: Arc<DownstreamWaits>,
    key: Option<u64>,
}

/// Counts of outbound calls since start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallCounts {
    /// Paired with an inbound request at the app.
    pub paired: u64,
    /// No inbound request at the app holds their key.
    pub unpaired: u64,
}

// === impl DownstreamWaits ===

impl DownstreamWaits {
    pub fn new(limit: Arc<InflightLimit>) -> Arc<Self> {
        Self::with_routes(limit, None)
    }

    /// As [`DownstreamWaits::new`], the pairs also feeding per-route levels.
    pub fn with_routes(limit: Arc<InflightLimit>, routes: Option<Arc<RouteState>>) -> Arc<Self> {
        let hasher = std::collections::hash_map::RandomState::new();
        let prefix = hasher.hash_one(std::process::id()) ^ hasher.hash_one(Instant::now());
        Arc::new(DownstreamWaits {
            limit,
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher,
            prefix,
            next_id: AtomicU64::new(0),
            paired: AtomicU64::new(0),
            unpaired: AtomicU64::new(0),
            routes,
        })
    }

    pub fn routes(&self) -> Option<&Arc<RouteState>> {
        self.routes.as_ref()
    }

    /// The route of the inbound request at the app that holds `headers`' key, if any, and
    /// whether that request is the door's probe.
    pub fn route_of(&self, headers: &HeaderMap) -> Option<(Arc<str>, bool)> {
        let key = self.key(headers)?;
        let shard = self.shard(key);
        let entry = shard.get(&key)?;
        Some((entry.route.clone()?, entry.probe))
    }

    fn shard(&self, key: u64) -> MutexGuard<'_, HashMap<u64, Entry>> {
        // Nothing under the lock can panic midway; a poisoned lock still holds consistent state.
        let shard = &self.shards[(key as usize) % SHARDS];
        shard.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The request's correlation key, if it carries one (see the module doc).
    pub fn key(&self, headers: &HeaderMap) -> Option<u64> {
        let id = headers
            .get(&TRACEPARENT)
            .and_then(|v| trace_id(v.as_bytes()))
            .or_else(|| headers.get(&REQUEST_ID).map(HeaderValue::as_bytes))
            .or_else(|| headers.get(&B3_TRACE_ID).map(HeaderValue::as_bytes))
            .filter(|id| !id.is_empty())?;
        let mut h = self.hasher.build_hasher();
        h.write(id);
        Some(h.finish())
    }

    /// An inbound request goes to the app: registers it under its key, stamping an
    /// `x-request-id` first if it carries none.
    pub fn visit(&self, headers: &mut HeaderMap) -> Option<Visit> {
        self.visit_route(headers, None, false)
    }

    /// As [`DownstreamWaits::visit`], remembering the request's route for its key, and
    /// whether it is the door's probe.
    pub fn visit_route(
        &self,
        headers: &mut HeaderMap,
        route: Option<&str>,
        probe: bool,
    ) -> Option<Visit> {
        let key = match self.key(headers) {
            Some(key) => key,
            None => {
                let n = self.next_id.fetch_add(1, Relaxed);
                let id = format!("weir-{:016x}-{n:x}", self.prefix);
                let value = HeaderValue::from_str(&id).ok()?;
                headers.insert(REQUEST_ID, value);
                self.key(headers)?
            }
        };
        let mut shard = self.shard(key);
        let entry = shard.entry(key).or_default();
        if let Some(route) = route {
            if entry.route.as_deref() != Some(route) {
                entry.route = Some(route.into());
            }
        }
        entry.probe = probe;
        entry.inbound += 1;
        entry.settle_lending(&self.limit);
        let start = Instant::now();
        Some(Visit { key, waited_before: entry.waited_until(start), start })
    }

    /// The app answered the request of `visit`: how long it waited on downstreams meanwhile.
    pub fn end(&self, visit: Visit) -> Duration {
        let mut shard = self.shard(visit.key);
        let Some(entry) = shard.get_mut(&visit.key) else { return Duration::ZERO };
        let now = Instant::now();
        let waited = entry.waited_until(now).saturating_sub(visit.waited_before);
        if let (Some(routes), Some(route)) = (&self.routes, &entry.route) {
            // How long the request held the app, and how much of it waiting on calls.
            routes.holds.record(route, now.saturating_duration_since(visit.start), waited);
        }
        entry.inbound = entry.inbound.saturating_sub(1);
        entry.settle_lending(&self.limit);
        if entry.inbound == 0 && entry.calls == 0 {
            shard.remove(&visit.key);
        }
        waited
    }

    /// The app makes an outbound call (through the egress role) with `headers`: while it is
    /// in flight, the inbound request of its key waits on it.
    pub fn call(self: &Arc<Self>, headers: &HeaderMap) -> Call {
        let key = self.key(headers).filter(|&key| {
            let mut shard = self.shard(key);
            let Some(entry) = shard.get_mut(&key) else { return false };
            entry.calls += 1;
            if entry.calls == 1 {
                entry.blocked_since = Some(Instant::now());
            }
            entry.settle_lending(&self.limit);
            true
        });
        let counter = if key.is_some() { &self.paired } else { &self.unpaired };
        counter.fetch_add(1, Relaxed);
        Call { waits: self.clone(), key }
    }

    pub fn counts(&self) -> CallCounts {
        CallCounts { paired: self.paired.load(Relaxed), unpaired: self.unpaired.load(Relaxed) }
    }

    /// Keys with a request at the app or a call in flight (for tests).
    pub fn keys(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map_or(0, |s| s.len())).sum()
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        let Some(key) = self.key else { return };
        let waits = &self.waits;
        let mut shard = waits.shard(key);
        let Some(entry) = shard.get_mut(&key) else { return };
        entry.calls = entry.calls.saturating_sub(1);
        if entry.calls == 0 {
            if let Some(since) = entry.blocked_since.take() {
                entry.waited += since.elapsed();
            }
        }
        entry.settle_lending(&waits.limit);
        if entry.inbound == 0 && entry.calls == 0 {
            shard.remove(&key);
        }
    }
}

/// The trace id of a `traceparent` value (`vv-<32 hex>-<16 hex>-ff`), if well formed.
fn trace_id(value: &[u8]) -> Option<&[u8]> {
    let mut parts = value.split(|&b| b == b'-');
    let (_version, id) = (parts.next()?, parts.next()?);
    (id.len() == 32 && id.iter().all(u8::is_ascii_hexdigit)).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.insert((*name).clone(), HeaderValue::from_str(value).unwrap());
        }
        h
    }

    const TRACE: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    const CHILD: &str = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01";

    #[test]
    fn keys_come_from_the_trace_id_then_the_request_id() {
        let w = DownstreamWaits::new(InflightLimit::new(4, 4));
        let parent = w.key(&headers(&[(&TRACEPARENT, TRACE)]));
        assert!(parent.is_some());
        assert_eq!(parent, w.key(&headers(&[(&TRACEPARENT, CHILD), (&REQUEST_ID, "x")])));
        assert_eq!(w.key(&headers(&[(&REQUEST_ID, "a")])), w.key(&headers(&[(&REQUEST_ID, "a")])));
        assert_ne!(w.key(&headers(&[(&REQUEST_ID, "a")])), w.key(&headers(&[(&REQUEST_ID, "b")])));
        // A malformed traceparent is no key; the request id behind it is.
        let bad = headers(&[(&TRACEPARENT, "00-xyz-1-01"), (&REQUEST_ID, "a")]);
        assert_eq!(w.key(&bad), w.key(&headers(&[(&REQUEST_ID, "a")])));
        assert_eq!(w.key(&HeaderMap::new()), None);
        assert!(w.key(&headers(&[(&B3_TRACE_ID, "463ac35c9f6413ad")])).is_some());
    }

    #[test]
    fn a_request_without_a_key_gets_one_stamped() {
        let w = DownstreamWaits::new(InflightLimit::new(4, 4));
        let mut h = HeaderMap::new();
        let visit = w.visit(&mut h).expect("stamped");
        let id = h.get(&REQUEST_ID).expect("x-request-id").to_str().unwrap().to_string();
        assert!(id.starts_with("weir-"), "{id}");
        let mut other = HeaderMap::new();
        let _second = w.visit(&mut other).expect("stamped");
        assert_ne!(other.get(&REQUEST_ID).unwrap().to_str().unwrap(), id, "ids are unique");
        assert_eq!(w.end(visit), Duration::ZERO);
    }

    #[test]
    fn a_paired_call_lends_the_slot_and_its_time_is_the_requests_wait() {
        // A limit of one under a ceiling of four.
        let limit = InflightLimit::new(4, 4);
        limit.set_limit(1);
        let w = DownstreamWaits::new(limit.clone());
        let slot = limit.try_slot().expect("the one slot");
        let mut h = headers(&[(&REQUEST_ID, "r1")]);
        let visit = w.visit(&mut h).unwrap();
        assert!(limit.try_slot().is_none(), "the limit is full");
        {
            let _call = w.call(&h);
            assert_eq!((limit.lent(), limit.held()), (1, 0));
            let lent = limit.try_slot().expect("the lent slot goes to another request");
            std::thread::sleep(Duration::from_millis(30));
            drop(lent);
        }
        assert_eq!(limit.lent(), 0, "returned when the call ends");
        let waited = w.end(visit);
        assert!(
            waited >= Duration::from_millis(30) && waited < Duration::from_secs(5),
            "{waited:?}"
        );
        assert_eq!(w.keys(), 0, "nothing left behind");
        drop(slot);
        assert_eq!(w.counts(), CallCounts { paired: 1, unpaired: 0 });
    }

    #[test]
    fn parallel_calls_count_once_and_unknown_keys_are_only_counted() {
        let limit = InflightLimit::new(4, 4);
        let w = DownstreamWaits::new(limit.clone());
        let mut h = headers(&[(&TRACEPARENT, TRACE)]);
        let visit = w.visit(&mut h).unwrap();
        let child = headers(&[(&TRACEPARENT, CHILD)]);
        let (a, b) = (w.call(&child), w.call(&child));
        assert_eq!(limit.lent(), 1, "one request waits, however many calls it makes");
        std::thread::sleep(Duration::from_millis(20));
        drop(a);
        assert_eq!(limit.lent(), 1);
        drop(b);
        assert_eq!(limit.lent(), 0);
        let stranger = w.call(&headers(&[(&REQUEST_ID, "nobody")]));
        assert_eq!(limit.lent(), 0);
        drop(stranger);
        let waited = w.end(visit);
        assert!(waited >= Duration::from_millis(20), "{waited:?}");
        assert_eq!(w.counts(), CallCounts { paired: 2, unpaired: 1 });
        assert_eq!(w.keys(), 0);
    }

    #[test]
    fn a_request_answered_while_its_call_is_in_flight_returns_the_slot() {
        let limit = InflightLimit::new(4, 4);
        let w = DownstreamWaits::new(limit.clone());
        let mut h = headers(&[(&REQUEST_ID, "r")]);
        let visit = w.visit(&mut h).unwrap();
        let call = w.call(&h);
        assert_eq!(limit.lent(), 1);
        w.end(visit);
        assert_eq!(limit.lent(), 0, "the request is gone: nothing is lent for it");
        drop(call);
        assert_eq!((limit.lent(), w.keys()), (0, 0));
    }
}

//! The inbound request path in-process, on tokio's paused clock: no socket, no wall clock.
//! The app is a test double behind [`AppClient`] that answers after a virtual delay, waits
//! to be released, stalls or fails; callers are `Request<CallerBody>`s handed to
//! [`Inbound::serve`]. Every time asserted is virtual, so each figure is exact (to the
//! timer wheel's millisecond) on any machine, however busy.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use admission_core::config::Law;
use admission_core::{AdmissionLevel, Priority};
use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Empty, Full};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{ConnState, Inbound};
use crate::app_client::{AppClient, ClientError, Exchange, Lease, Protocol};
use crate::body::{CallerBody, RequestBody, ResponseBody};
use crate::config::{AppProtocol, SidecarConfig};
use crate::shared::Shared;
use crate::telemetry::ProxyMetrics;

const MS: Duration = Duration::from_millis(1);

/// The budget header (`inbound.headers.timeout`'s default).
const TIMEOUT: &str = "x-request-timeout-ms";

// === the app double ===

/// How the app answers, by the request's path:
/// - `/read`: reads the request body to its end, then answers 200 with its length;
/// - `/after/<ms>`: 200 after that many (virtual) milliseconds;
/// - `/hold`: 200 once the test releases it ([`App::release`]);
/// - `/stall`: never;
/// - `/fail`: the connection is refused (as by an app that is down).
struct App {
    /// Each request that reached the app: its path, the budget it was sent with, and when.
    seen: Mutex<Vec<(String, Option<String>, Instant)>>,
    holds: Semaphore,
}

impl Default for App {
    fn default() -> Self {
        App { seen: Mutex::default(), holds: Semaphore::new(0) }
    }
}

impl App {
    fn paths(&self) -> Vec<String> {
        self.seen.lock().unwrap().iter().map(|(p, ..)| p.clone()).collect()
    }

    fn release(&self, n: usize) {
        self.holds.add_permits(n);
    }
}

struct TestApp(Arc<App>);

const APP_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9);

impl AppClient for TestApp {
    type Body = Full<Bytes>;

    fn addr(&self) -> SocketAddr {
        APP_ADDR
    }

    fn send(
        &self,
        _protocol: Protocol,
        req: Request<RequestBody>,
        _now: std::time::Instant,
    ) -> impl Future<Output = Result<Exchange<Full<Bytes>>, ClientError>> + Send {
        let app = self.0.clone();
        async move {
            let path = req.uri().path().to_owned();
            let budget = req.headers().get(TIMEOUT).map(|v| v.to_str().unwrap().to_owned());
            app.seen.lock().unwrap().push((path.clone(), budget, Instant::now()));
            match path.as_str() {
                "/read" => {
                    let Ok(body) = req.into_body().collect().await else {
                        let source = std::io::ErrorKind::BrokenPipe.into();
                        return Err(ClientError::Connect { addr: APP_ADDR, source });
                    };
                    let len = body.to_bytes().len().to_string();
                    let response = Response::new(Full::new(Bytes::from(len)));
                    return Ok(Exchange { response, lease: Lease::detached() });
                }
                "/hold" => app.holds.acquire().await.unwrap().forget(),
                "/stall" => std::future::pending().await,
                "/fail" => {
                    let source = std::io::ErrorKind::ConnectionRefused.into();
                    return Err(ClientError::Connect { addr: APP_ADDR, source });
                }
                _ => {
                    let ms = path.strip_prefix("/after/").expect("a known path").parse().unwrap();
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
            }
            let response = Response::new(Full::new(Bytes::from_static(b"ok")));
            Ok(Exchange { response, lease: Lease::detached() })
        }
    }
}

// === the sidecar, in-process ===

struct Sidecar {
    inbound: Arc<Inbound<TestApp>>,
    app: Arc<App>,
    /// One caller connection for every request.
    conn: Arc<ConnState>,
    /// Kept: dropping it would start the drain.
    _drain: weir_net::drain::Drain,
}

/// The shipped defaults, but for an in-flight limit of one that stays put (so the queue is
/// easy to fill), HTTP/1.1 to the app (nothing to probe) and the paper's law; `configure`
/// changes the rest. Tests run on a paused clock (`start_paused`).
fn sidecar(configure: impl FnOnce(&mut SidecarConfig)) -> Sidecar {
    let mut config = SidecarConfig::default();
    config.inbound.max_inflight = 1;
    config.inbound.adaptive_inflight = false;
    config.inbound.app_protocol = AppProtocol::Http1;
    config.admission.law = Law::Dagor;
    configure(&mut config);
    config.validate().expect("a valid configuration");
    let table = crate::admin::initial_table(&config).unwrap();
    let (drain, watch) = weir_net::drain::channel();
    let shared = Arc::new(Shared::new(&config, table, watch));
    let app = Arc::new(App::default());
    let test_app = TestApp(app.clone());
    let inbound = Inbound::with_app(&config, shared, ProxyMetrics::register(), test_app).unwrap();
    Sidecar { inbound: Arc::new(inbound), app, conn: Arc::default(), _drain: drain }
}

/// A response and the (virtual) instant it was ready.
type Answered = (Response<ResponseBody>, Instant);

impl Sidecar {
    fn shared(&self) -> &Shared {
        self.inbound.shared()
    }

    /// Sends `req` as a caller would; the task ends with the response (a request the path
    /// never answers fails the test after a virtual minute instead of hanging it).
    fn send(&self, req: Request<CallerBody>) -> JoinHandle<Answered> {
        let serve = self.inbound.clone().serve(self.conn.clone(), req);
        tokio::spawn(async move {
            let answered = tokio::time::timeout(Duration::from_secs(60), serve).await;
            (answered.expect("answered within a (virtual) minute"), Instant::now())
        })
    }

    /// Lets every spawned task run as far as it can without time moving, until `done`.
    async fn settle(&self, what: &str, done: impl Fn(&Self) -> bool) {
        for _ in 0..1000 {
            if done(self) {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("never settled: {what}");
    }
}

/// `GET path` with `headers`, no body, over HTTP/1.1.
fn get(path: &str, headers: &[(&str, &str)]) -> Request<CallerBody> {
    let mut req = Request::get(path).header("host", "app.test");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.body(CallerBody::new(Empty::<Bytes>::new())).unwrap()
}

/// A request body the test sends piece by piece, of `declared` length (else unknown, as a
/// chunked upload's); it ends when the sender is dropped.
struct TestBody {
    pieces: tokio::sync::mpsc::Receiver<Bytes>,
    declared: Option<u64>,
}

impl hyper::body::Body for TestBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let piece = std::task::ready!(self.pieces.poll_recv(cx));
        if let (Some(left), Some(data)) = (self.declared.as_mut(), &piece) {
            *left = left.saturating_sub(data.len() as u64);
        }
        std::task::Poll::Ready(piece.map(|data| Ok(hyper::body::Frame::data(data))))
    }

    /// Ended once the declared length is here, as hyper's own body is.
    fn is_end_stream(&self) -> bool {
        self.declared == Some(0)
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.declared.map_or_else(hyper::body::SizeHint::new, hyper::body::SizeHint::with_exact)
    }
}

/// `POST /read` with `headers` and a body the returned sender feeds.
fn upload(
    declared: Option<u64>,
    headers: &[(&str, &str)],
) -> (tokio::sync::mpsc::Sender<Bytes>, Request<CallerBody>) {
    let (tx, pieces) = tokio::sync::mpsc::channel(16);
    let mut req = Request::post("/read").header("host", "app.test");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    (tx, req.body(CallerBody::new(TestBody { pieces, declared })).unwrap())
}

/// A gRPC call over HTTP/2 with `grpc-timeout: <ms>m`.
fn grpc(path: &str, timeout_ms: u64) -> Request<CallerBody> {
    let timeout = format!("{timeout_ms}m");
    let mut req = get(path, &[("content-type", "application/grpc"), ("grpc-timeout", &timeout)]);
    *req.version_mut() = Version::HTTP_2;
    req
}

fn priority_headers(p: Priority) -> [(&'static str, String); 2] {
    [("x-business-priority", p.business.to_string()), ("x-user-priority", p.user.to_string())]
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).map(|v| v.to_str().unwrap())
}

/// Asserts `at` is `after` past `start`, to the timer wheel's millisecond (a timer fires
/// at the first tick at or past its instant).
#[track_caller]
fn assert_at(at: Instant, start: Instant, after: Duration) {
    let took = at - start;
    assert!(after <= took && took <= after + MS, "at {took:?}, expected {after:?}");
}

/// Requests counted with `outcome`, over every class.
fn counted(s: &Sidecar, outcome: impl Fn(&admission_core::audit::ClassCounts) -> u64) -> u64 {
    s.shared().audit.snapshot().classes.iter().map(outcome).sum()
}

async fn body_of(resp: Response<ResponseBody>) -> Bytes {
    resp.into_body().collect().await.unwrap().to_bytes()
}

// === the tests ===

/// The plain path: admitted, sent with its remaining budget, answered when the app
/// answers; the slot is back and the app's time learnt. An app that is down is a 502.
#[tokio::test(start_paused = true)]
async fn a_request_is_admitted_forwarded_with_its_budget_and_answered() {
    let s = sidecar(|_| {});
    let start = Instant::now();
    let (resp, at) = s.send(get("/after/40", &[(TIMEOUT, "300")])).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_at(at, start, 40 * MS);
    let open = s.inbound.refusals.level_value(AdmissionLevel::FULLY_OPEN);
    assert_eq!(resp.headers().get("x-admission-level"), Some(&open));
    assert_eq!(body_of(resp).await, "ok");
    assert_eq!(s.app.seen.lock().unwrap()[0], ("/after/40".into(), Some("300".into()), start));
    assert_eq!(s.shared().limit.inflight(), 0, "the slot is back");
    assert_eq!(s.shared().app_time.typical(), 40 * MS);
    assert_eq!(counted(&s, |c| c.admitted), 1);

    let (resp, at) = s.send(get("/fail", &[])).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(header(resp.headers(), "x-weir-error"), Some("app-unreachable"));
    assert_at(at, start, 40 * MS);
    assert_eq!(s.shared().limit.inflight(), 0);
}

/// The door: with the app's time known (100 ms) and one slot, a newcomer behind one waiter
/// expects 100 ms of wait plus 100 ms at the app. A budget of 150 ms cannot cover that: it
/// is refused at once (no time passes), and never reaches the app; 250 ms can: it queues,
/// and is served.
#[tokio::test(start_paused = true)]
async fn the_door_refuses_at_once_what_its_budget_cannot_wait_for() {
    let s = sidecar(|_| {});
    s.send(get("/after/100", &[])).await.unwrap();
    assert_eq!(s.shared().app_time.typical(), 100 * MS);

    let start = Instant::now();
    let holder = s.send(get("/hold", &[]));
    let first = s.send(get("/after/100", &[(TIMEOUT, "1000")]));
    s.settle("one in flight, one waiting", |s| s.shared().limit.queued() == 1).await;

    let (refused, at) = s.send(get("/after/100?short", &[(TIMEOUT, "150")])).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(refused.headers(), "x-weir-shed"), Some("overload"));
    assert_eq!(at, start, "refused without waiting");

    let fits = s.send(get("/after/100?fits", &[(TIMEOUT, "250")]));
    s.settle("two waiting", |s| s.shared().limit.queued() == 2).await;
    s.app.release(1);
    assert_eq!(holder.await.unwrap().0.status(), StatusCode::OK);
    let (first, _) = first.await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let (fits, at) = fits.await.unwrap();
    assert_eq!(fits.status(), StatusCode::OK);
    assert_at(at, start, 200 * MS);
    assert_eq!(s.app.paths(), ["/after/100", "/hold", "/after/100", "/after/100"]);
}

/// A request queued behind a stalled app, its budget 200 ms and the app's time unknown, is
/// refused as `deadline` exactly when its budget runs out, not a millisecond before, and
/// never reaches the app. The stalled request itself is answered 504 at its own deadline,
/// and its slot is free at once (the app's time is not known yet: nothing to hold it for):
/// the next one is served.
#[tokio::test(start_paused = true)]
async fn a_queued_request_is_refused_when_its_budget_runs_out_and_a_stall_at_its_deadline() {
    let s = sidecar(|_| {});
    let start = Instant::now();
    let stalled = s.send(get("/stall", &[(TIMEOUT, "300")]));
    s.settle("the app holds one", |s| s.shared().limit.inflight() == 1).await;
    let queued = s.send(get("/after/1", &[(TIMEOUT, "200")]));
    let after = s.send(get("/after/10", &[(TIMEOUT, "1000")]));
    s.settle("two waiting", |s| s.shared().limit.queued() == 2).await;

    tokio::time::sleep_until(start + 199 * MS).await;
    assert!(!queued.is_finished(), "refused before its budget ran out");
    let (refused, at) = queued.await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(refused.headers(), "x-weir-shed"), Some("deadline"));
    assert_at(at, start, 200 * MS);

    let (timed_out, at) = stalled.await.unwrap();
    assert_eq!(timed_out.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(header(timed_out.headers(), "x-weir-error"), Some("app-timeout"));
    assert_at(at, start, 300 * MS);
    let (served, at) = after.await.unwrap();
    assert_eq!(served.status(), StatusCode::OK);
    assert_at(at, start, 310 * MS);
    assert_eq!(s.app.paths(), ["/stall", "/after/10"], "nothing past its budget reached the app");
    assert_eq!(counted(&s, |c| c.shed_deadline), 1);

    // A budget already spent is refused at once.
    let (spent, at) = s.send(get("/after/1", &[(TIMEOUT, "0")])).await.unwrap();
    assert_eq!(spent.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(spent.headers(), "x-weir-shed"), Some("deadline"));
    assert_eq!(at, Instant::now());
    assert_eq!(s.app.paths().len(), 2);
}

/// A request the app has not answered by its deadline is answered 504 then, but the app
/// most likely still holds it and will spend its typical time on it: the slot is held that
/// long (100 ms here) after the 504, so the sidecar does not send the next request into
/// the app's own queue behind it. The next one is served once the slot is back; a request
/// the app answers in time gives its slot back at once as ever.
#[tokio::test(start_paused = true)]
async fn a_timed_out_request_keeps_its_slot_for_the_apps_typical_time() {
    let s = sidecar(|_| {});
    s.send(get("/after/100", &[])).await.unwrap();
    assert_eq!(s.shared().app_time.typical(), 100 * MS);

    let start = Instant::now();
    let stalled = s.send(get("/stall", &[(TIMEOUT, "300")]));
    s.settle("the app holds one", |s| s.shared().limit.inflight() == 1).await;
    let next = s.send(get("/after/10", &[(TIMEOUT, "1000")]));
    s.settle("one waiting", |s| s.shared().limit.queued() == 1).await;

    let (timed_out, at) = stalled.await.unwrap();
    assert_eq!(timed_out.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(header(timed_out.headers(), "x-weir-error"), Some("app-timeout"));
    assert_at(at, start, 300 * MS);
    assert_eq!(s.shared().limit.inflight(), 1, "held after the 504");
    assert_eq!(s.shared().limit.queued(), 1, "the next one still waits");

    let (served, at) = next.await.unwrap();
    assert_eq!(served.status(), StatusCode::OK);
    assert_at(at, start, 410 * MS);
    assert_eq!(s.shared().limit.inflight(), 0, "the slot is back");
    assert_eq!(s.app.paths(), ["/after/100", "/stall", "/after/10"]);
}

/// A burst past what the app can serve in its budget: 40 requests at once with 150 ms each,
/// one at a time to a 40 ms app, and no max wait. Every caller hears by its deadline; what
/// reaches the app arrives before its deadline with the budget less the wait; the rest are
/// refused `deadline` and never reach it.
#[tokio::test(start_paused = true)]
async fn a_burst_past_its_deadlines_never_reaches_the_app_late() {
    let s = sidecar(|c| c.inbound.overload_max_wait = Duration::ZERO);
    let start = Instant::now();
    let burst: Vec<_> = (0..40)
        .map(|i| {
            let business = if i % 2 == 0 { "1" } else { "2" };
            s.send(get("/after/40", &[(TIMEOUT, "150"), ("x-business-priority", business)]))
        })
        .collect();
    let (mut served, mut refused) = (0, 0);
    for answer in burst {
        let (resp, at) = answer.await.unwrap();
        assert!(at - start <= 150 * MS, "answered at {:?}, past the budget", at - start);
        match resp.status() {
            StatusCode::OK => served += 1,
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(header(resp.headers(), "x-weir-shed"), Some("deadline"));
                refused += 1;
            }
            other => panic!("unexpected {other}"),
        }
    }
    assert!(served >= 1 && refused >= 20, "{served} served, {refused} refused");
    let seen = s.app.seen.lock().unwrap();
    assert_eq!(seen.len(), served, "refused requests never reached the app");
    for (_, budget, at) in seen.iter() {
        let waited = (*at - start).as_millis() as u64;
        assert!(waited < 150, "reached the app {waited} ms in");
        let left: u64 = budget.as_deref().unwrap().parse().unwrap();
        assert!((150 - waited).abs_diff(left) <= 1, "forwarded {left} ms after {waited} ms");
    }
}

/// Cuts the level until it binds, as a spike would: windows of arrivals over eight business
/// classes that all waited 100 ms, closed by their count.
fn overload(shared: &Shared, window_requests: u32) -> AdmissionLevel {
    let engine = &shared.engine;
    for _ in 0..100 {
        if engine.level_binds() {
            return engine.level();
        }
        for i in 0..window_requests {
            engine.admit(Priority { business: (i % 8) as u8, user: (i * 37 % 128) as u8 });
        }
        for _ in 0..window_requests {
            engine.record_queuing(100 * MS);
        }
    }
    panic!("the level never bound (level {})", engine.level());
}

/// Two waiters behind a held slot, both admitted by the level: `first`, then 5 ms later
/// `second`, less important. Returns both answers.
async fn two_waiters(s: &Sidecar, first: Priority, second: Priority) -> (Answered, Answered) {
    let start = Instant::now();
    let holder = s.send(get("/hold", &[("x-business-priority", "0"), ("x-user-priority", "0")]));
    let send = |p, path| {
        let [(b, bv), (u, uv)] = priority_headers(p);
        s.send(get(path, &[(b, &bv), (u, &uv), (TIMEOUT, "1000")]))
    };
    let first = send(first, "/after/1?first");
    s.settle("one waiting", |s| s.shared().limit.queued() == 1).await;
    tokio::time::sleep(5 * MS).await;
    let second = send(second, "/after/1?second");
    s.settle("two waiting", |s| s.shared().limit.queued() == 2).await;
    // Past the max wait (30 ms) of both.
    tokio::time::sleep_until(start + 60 * MS).await;
    s.app.release(1);
    assert_eq!(holder.await.unwrap().0.status(), StatusCode::OK);
    (first.await.unwrap(), second.await.unwrap())
}

/// A sidecar whose level binds (windows of `WINDOW` requests, closed by their count alone:
/// the engine's own clock is the wall's), and two priorities it admits: the level's own and
/// the one just more important.
fn overloaded_sidecar() -> (Sidecar, Priority, Priority) {
    const WINDOW: u32 = 100;
    let s = sidecar(|c| {
        c.admission.window_requests = WINDOW;
        c.admission.window = Duration::from_secs(3600);
    });
    let level = overload(s.shared(), WINDOW);
    assert!(level.compound() >= 2, "level {level}");
    let more_important = Priority::from_compound(level.compound() - 1).unwrap();
    (s, more_important, level.priority())
}

/// While the level binds, a waiter past the max wait (30 ms) evicts the less important
/// waiting behind it: the second waiter is refused (`overload`) when the first's max wait
/// ends, before its own would (35 ms), and never reaches the app; the first is served.
#[tokio::test(start_paused = true)]
async fn past_the_max_wait_a_binding_level_evicts_the_less_important_waiters() {
    let (s, first, second) = overloaded_sidecar();
    let start = Instant::now();
    let ((served, _), (evicted, at)) = two_waiters(&s, first, second).await;
    assert_eq!(served.status(), StatusCode::OK);
    assert_eq!(evicted.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(evicted.headers(), "x-weir-shed"), Some("overload"));
    assert_at(at, start, 30 * MS);
    assert_eq!(s.app.paths(), ["/hold", "/after/1"]);
}

/// The same queue behind an open level (a burst, not a spike): nobody is evicted or waited
/// out; both waiters keep their budgets and are served.
#[tokio::test(start_paused = true)]
async fn behind_an_open_level_waiters_keep_their_budgets_past_the_max_wait() {
    let s = sidecar(|_| {});
    let (first, second) = (Priority { business: 3, user: 10 }, Priority { business: 3, user: 11 });
    assert!(!s.shared().engine.level_binds());
    let ((a, _), (b, _)) = two_waiters(&s, first, second).await;
    assert_eq!((a.status(), b.status()), (StatusCode::OK, StatusCode::OK));
}

/// gRPC callers get every refusal as a trailers-only response (HTTP 200, no body, the status
/// in the headers): RESOURCE_EXHAUSTED for a call refused in the queue at its
/// `grpc-timeout`, DEADLINE_EXCEEDED for a call the stalled app did not answer in time.
#[tokio::test(start_paused = true)]
async fn grpc_refusals_are_trailers_only_statuses() {
    let s = sidecar(|_| {});
    let start = Instant::now();
    let stalled = s.send(grpc("/stall", 300));
    s.settle("the app holds one", |s| s.shared().limit.inflight() == 1).await;
    let (refused, at) = s.send(grpc("/after/1", 100)).await.unwrap();
    assert_at(at, start, 100 * MS);
    let (timed_out, at) = stalled.await.unwrap();
    assert_at(at, start, 300 * MS);
    for (resp, grpc_status, why) in [
        (refused, "8", ("x-weir-shed", "deadline")),
        (timed_out, "4", ("x-weir-error", "app-timeout")),
    ] {
        let h = resp.headers();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(header(h, "content-type"), Some("application/grpc"));
        assert_eq!(header(h, "grpc-status"), Some(grpc_status));
        assert_eq!(header(h, why.0), Some(why.1));
        assert!(hyper::body::Body::is_end_stream(resp.body()), "trailers-only: no body");
    }
    assert_eq!(s.app.paths(), ["/stall"]);
}

/// A body of declared length takes no slot until it has arrived: with one slot, a caller
/// trickling 100 declared bytes one every 50 ms under a 300 ms budget holds nothing while a
/// GET is served at once, and is answered 504 (`caller-body-late`) at its deadline without
/// reaching the app. A body that arrives in time is read whole first and then forwarded.
#[tokio::test(start_paused = true)]
async fn a_body_of_declared_length_takes_no_slot_until_it_has_arrived() {
    let s = sidecar(|_| {});
    let start = Instant::now();
    let (tx, req) = upload(Some(100), &[(TIMEOUT, "300")]);
    let trickled = s.send(req);
    let trickler = tokio::spawn(async move {
        while tx.send(Bytes::from_static(b"x")).await.is_ok() {
            tokio::time::sleep(50 * MS).await;
        }
    });
    tokio::time::sleep(20 * MS).await;
    assert_eq!((s.shared().limit.inflight(), s.shared().limit.queued()), (0, 0));
    let (served, at) = s.send(get("/after/10", &[])).await.unwrap();
    assert_eq!(served.status(), StatusCode::OK);
    assert_at(at, start, 30 * MS);

    let (late, at) = trickled.await.unwrap();
    assert_eq!(late.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(header(late.headers(), "x-weir-error"), Some("caller-body-late"));
    assert_at(at, start, 300 * MS);
    assert_eq!(s.app.paths(), ["/after/10"], "the trickled request never reached the app");
    trickler.abort();

    // Sent in two pieces 40 ms apart: forwarded whole once the second is here.
    let start = Instant::now();
    let (tx, req) = upload(Some(9), &[(TIMEOUT, "300")]);
    let whole = s.send(req);
    tx.send(Bytes::from_static(b"four")).await.unwrap();
    tokio::time::sleep(40 * MS).await;
    assert_eq!(s.app.paths().len(), 1, "not at the app before its body is here");
    tx.send(Bytes::from_static(b"+five")).await.unwrap();
    let (resp, at) = whole.await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_at(at, start, 40 * MS);
    assert_eq!(body_of(resp).await, "9");
    assert_eq!(s.shared().limit.inflight(), 0);
}

/// A body without a declared length goes to the app as it comes; once the app has waited
/// its typical time (10 ms) on the caller, the slot is lent: with a limit of one (below a
/// ceiling of two, as the adaptive limit is), another request is served meanwhile. When the
/// body ends the slot counts again and then goes back, and the app's time learnt from the
/// upload leaves out the wait for the caller.
#[tokio::test(start_paused = true)]
async fn a_streaming_body_that_keeps_the_app_waiting_lends_its_slot() {
    let s = sidecar(|c| c.inbound.max_inflight = 2);
    s.shared().limit.set_limit(1);
    assert_eq!(s.shared().limit.ceiling(), 2);
    s.send(get("/after/10", &[])).await.unwrap();
    assert_eq!(s.shared().app_time.typical(), 10 * MS);
    let start = Instant::now();
    let (tx, req) = upload(None, &[(TIMEOUT, "1000")]);
    tx.send(Bytes::from_static(b"first")).await.unwrap();
    let uploading = s.send(req);
    s.settle("the upload at the app", |s| s.app.paths().len() == 2).await;
    tokio::time::sleep(9 * MS).await;
    let limit = &s.shared().limit;
    assert_eq!((limit.inflight(), limit.lent()), (1, 0), "held within the grace");
    tokio::time::sleep(2 * MS).await;
    assert_eq!((limit.inflight(), limit.lent()), (1, 1), "lent past the grace");

    let (served, at) = s.send(get("/after/10?meanwhile", &[])).await.unwrap();
    assert_eq!(served.status(), StatusCode::OK);
    assert_at(at, start, 21 * MS);

    tx.send(Bytes::from_static(b"+rest")).await.unwrap();
    drop(tx);
    let (resp, at) = uploading.await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_at(at, start, 21 * MS);
    assert_eq!(body_of(resp).await, "10");
    assert_eq!((limit.inflight(), limit.lent()), (0, 0));
    assert!(s.shared().app_time.typical() <= 10 * MS, "{:?}", s.shared().app_time.typical());
}

/// A request moves through every layer of the path and through hyper's client channel, each
/// move a copy: its body, when there is none (the usual request), is one pointer wide.
#[test]
fn a_request_without_a_body_carries_one_pointer_for_it() {
    assert_eq!(std::mem::size_of::<RequestBody>(), std::mem::size_of::<usize>());
    assert!(RequestBody::new(CallerBody::new(Empty::<Bytes>::new()), MS).is_none());
}

/// Every layer builds and moves the request path's futures, each move a copy of the whole
/// state (the connection boxes the role's future once, from the stack): the state a request
/// carries stays within bounds (today: serve ~3.0 KB, handle ~2.4 KB, the queue's wait
/// ~0.5 KB; the app client's future is boxed apart).
#[tokio::test(start_paused = true)]
async fn the_request_paths_futures_stay_small() {
    let s = sidecar(|_| {});
    let serve = s.inbound.clone().serve(s.conn.clone(), get("/", &[]));
    let handle = s.inbound.handle(&s.conn, get("/", &[]), None, false);
    let waiter = s.inbound.waiter(Priority::MOST_IMPORTANT, Instant::now(), Instant::now());
    let queued = s.inbound.queued(&s.conn, &waiter, None, false, Priority::MOST_IMPORTANT);
    let sizes = [
        std::mem::size_of_val(&serve),
        std::mem::size_of_val(&handle),
        std::mem::size_of_val(&queued),
    ];
    assert!(sizes[0] <= 4096 && sizes[1] <= 3072 && sizes[2] <= 1024, "{sizes:?}");
}

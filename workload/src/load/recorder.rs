//! Per-class outcome counts, latency histograms and a per-second series.

use super::{ClassSpec, LoadSpec};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// How one request ended, as the client saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// 503, or gRPC status 8; carries `x-weir-shed` (or "unlabelled": HAProxy, the app).
    Refused(String),
    TimedOut,
    Error,
}

impl Outcome {
    pub fn classify(parts: &http::response::Parts, trailers: Option<&http::HeaderMap>) -> Self {
        let header = |map: &http::HeaderMap, name: &str| {
            map.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
        };
        let grpc_status = header(&parts.headers, "grpc-status")
            .or_else(|| trailers.and_then(|t| header(t, "grpc-status")));
        let shed = || {
            Outcome::Refused(header(&parts.headers, "x-weir-shed").unwrap_or("unlabelled".into()))
        };
        match (parts.status.as_u16(), grpc_status.as_deref()) {
            (503, _) | (_, Some("8")) => shed(),
            (200..=299, None | Some("0")) => Outcome::Ok,
            _ => Outcome::Error,
        }
    }
}

/// How a request ended, without the refusal's reason: what the per-request log keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ending {
    Ok,
    Refused,
    TimedOut,
    Error,
}

/// One request of the run, for analyses finer than a second (settle and recovery times,
/// latency quantiles over any span). Times are offsets from the start of the run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Event {
    pub class: u16,
    /// When it was scheduled to be sent, seconds since the start.
    pub at_secs: f64,
    /// From the scheduled send to the answer (or to the client giving up).
    pub latency_ms: f64,
    pub ending: Ending,
}

/// One request as its user saw it, for per-user analyses (fairness between users).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct UserEvent {
    /// The user's index (`x-user-id: user-{user}`).
    pub user: u32,
    /// When it was sent, microseconds since the Unix epoch (the clock an entry sidecar's
    /// re-key periods count in).
    pub sent_unix_us: u64,
    pub ending: Ending,
}

/// Totals for one class over the steady part of a run (after warmup).
#[derive(Clone, Debug, Default, Serialize)]
pub struct ClassReport {
    pub name: String,
    pub business: u8,
    pub sent: u64,
    pub ok: u64,
    pub refused: u64,
    pub timed_out: u64,
    pub errors: u64,
    /// Refusals by `x-weir-shed` value.
    pub refused_by_reason: BTreeMap<String, u64>,
    pub ok_p50_ms: f64,
    pub ok_p99_ms: f64,
    pub refused_p50_ms: f64,
    pub refused_p99_ms: f64,
}

impl ClassReport {
    pub fn success_ratio(&self) -> f64 {
        if self.sent == 0 {
            1.0
        } else {
            self.ok as f64 / self.sent as f64
        }
    }
}

/// One second of the run (requests counted by the second they were scheduled in).
#[derive(Clone, Debug, Default, Serialize)]
pub struct SecondReport {
    pub second: u32,
    pub sent: Vec<u64>,
    pub ok: Vec<u64>,
    pub refused: Vec<u64>,
    pub timed_out: Vec<u64>,
    pub errors: Vec<u64>,
    /// Mean latency of the successful requests, milliseconds.
    pub ok_mean_ms: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct LoadReport {
    pub duration_secs: f64,
    pub steady_secs: f64,
    pub classes: Vec<ClassReport>,
    pub all_ok_p50_ms: f64,
    pub all_ok_p99_ms: f64,
    pub all_refused_p50_ms: f64,
    pub all_refused_p99_ms: f64,
    pub series: Vec<SecondReport>,
    /// Every request, in the order they finished (not serialised: it can be large).
    #[serde(skip)]
    pub events: Vec<Event>,
}

impl LoadReport {
    pub fn sent(&self) -> u64 {
        self.classes.iter().map(|c| c.sent).sum()
    }
    pub fn ok(&self) -> u64 {
        self.classes.iter().map(|c| c.ok).sum()
    }
    pub fn refused(&self) -> u64 {
        self.classes.iter().map(|c| c.refused).sum()
    }
    /// Successful responses per second over the steady part.
    pub fn goodput(&self) -> f64 {
        self.ok() as f64 / self.steady_secs.max(1e-9)
    }
    pub fn offered(&self) -> f64 {
        self.sent() as f64 / self.steady_secs.max(1e-9)
    }
}

struct ClassState {
    report: ClassReport,
    ok_latency: Histogram<u64>,
    refused_latency: Histogram<u64>,
}

struct State {
    start: Instant,
    classes: Vec<ClassState>,
    series: Vec<SecondReport>,
    ok_latency_sum_us: Vec<u64>,
    events: Vec<Event>,
}

pub struct Recorder {
    warmup: Duration,
    duration: Duration,
    class_count: usize,
    state: Mutex<State>,
    user_events: Mutex<Vec<UserEvent>>,
}

fn histogram() -> Histogram<u64> {
    // Microseconds, 1 us .. 60 s, 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("static histogram bounds are valid")
}

fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(q) as f64 / 1000.0
    }
}

// === impl Recorder ===

impl Recorder {
    pub(super) fn new(spec: &LoadSpec) -> Self {
        let classes = spec.classes.iter().map(ClassState::new).collect();
        let state = State {
            start: Instant::now(),
            classes,
            series: Vec::new(),
            ok_latency_sum_us: Vec::new(),
            events: Vec::new(),
        };
        Recorder {
            warmup: spec.warmup,
            duration: spec.duration(),
            class_count: spec.classes.len(),
            state: Mutex::new(state),
            user_events: Mutex::new(Vec::new()),
        }
    }

    /// Marks the start of the run and returns it.
    pub(super) fn start(&self) -> Instant {
        let mut state = self.lock();
        state.start = Instant::now();
        state.start
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn record(&self, class: usize, scheduled: Instant, finished: Instant, outcome: Outcome) {
        let latency_us = finished.saturating_duration_since(scheduled).as_micros() as u64;
        let mut state = self.lock();
        let offset = scheduled.saturating_duration_since(state.start);
        let second = offset.as_secs() as usize;
        let n = self.class_count;
        while state.series.len() <= second {
            let s = state.series.len() as u32;
            state.series.push(SecondReport::empty(s, n));
            state.ok_latency_sum_us.push(0);
        }
        let bucket = &mut state.series[second];
        bucket.sent[class] += 1;
        match &outcome {
            Outcome::Ok => bucket.ok[class] += 1,
            Outcome::Refused(_) => bucket.refused[class] += 1,
            Outcome::TimedOut => bucket.timed_out[class] += 1,
            Outcome::Error => bucket.errors[class] += 1,
        }
        if outcome == Outcome::Ok {
            state.ok_latency_sum_us[second] += latency_us;
        }
        let ending = match outcome {
            Outcome::Ok => Ending::Ok,
            Outcome::Refused(_) => Ending::Refused,
            Outcome::TimedOut => Ending::TimedOut,
            Outcome::Error => Ending::Error,
        };
        state.events.push(Event {
            class: class as u16,
            at_secs: offset.as_secs_f64(),
            latency_ms: latency_us as f64 / 1000.0,
            ending,
        });
        if offset >= self.warmup {
            state.classes[class].record(latency_us, outcome);
        }
    }

    /// Records which user sent a request and how it ended (kept apart from the per-class
    /// log, which does not know users).
    pub fn record_user(&self, user: u32, sent_unix_us: u64, outcome: &Outcome) {
        let ending = match outcome {
            Outcome::Ok => Ending::Ok,
            Outcome::Refused(_) => Ending::Refused,
            Outcome::TimedOut => Ending::TimedOut,
            Outcome::Error => Ending::Error,
        };
        let event = UserEvent { user, sent_unix_us, ending };
        self.user_events.lock().unwrap_or_else(|e| e.into_inner()).push(event);
    }

    /// Every request with its user, in the order they finished.
    pub fn user_events(&self) -> Vec<UserEvent> {
        self.user_events.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The series so far (for live views).
    pub fn series(&self) -> Vec<SecondReport> {
        let state = self.lock();
        finish_series(&state)
    }

    pub fn elapsed(&self) -> Duration {
        self.lock().start.elapsed()
    }

    pub fn report(&self) -> LoadReport {
        let state = self.lock();
        let mut all_ok = histogram();
        let mut all_refused = histogram();
        for class in &state.classes {
            let _ = all_ok.add(&class.ok_latency);
            let _ = all_refused.add(&class.refused_latency);
        }
        LoadReport {
            duration_secs: self.duration.as_secs_f64(),
            steady_secs: self.duration.saturating_sub(self.warmup).as_secs_f64(),
            classes: state.classes.iter().map(ClassState::report).collect(),
            all_ok_p50_ms: ms(&all_ok, 0.5),
            all_ok_p99_ms: ms(&all_ok, 0.99),
            all_refused_p50_ms: ms(&all_refused, 0.5),
            all_refused_p99_ms: ms(&all_refused, 0.99),
            series: finish_series(&state),
            events: state.events.clone(),
        }
    }
}

fn finish_series(state: &State) -> Vec<SecondReport> {
    let mut series = state.series.clone();
    for (bucket, sum) in series.iter_mut().zip(&state.ok_latency_sum_us) {
        let ok: u64 = bucket.ok.iter().sum();
        bucket.ok_mean_ms = if ok == 0 { 0.0 } else { *sum as f64 / ok as f64 / 1000.0 };
    }
    series
}

// === impl ClassState ===

impl ClassState {
    fn new(spec: &ClassSpec) -> Self {
        let report =
            ClassReport { name: spec.name.clone(), business: spec.business, ..Default::default() };
        ClassState { report, ok_latency: histogram(), refused_latency: histogram() }
    }

    fn record(&mut self, latency_us: u64, outcome: Outcome) {
        let r = &mut self.report;
        r.sent += 1;
        let latency_us = latency_us.clamp(1, 60_000_000);
        match outcome {
            Outcome::Ok => {
                r.ok += 1;
                let _ = self.ok_latency.record(latency_us);
            }
            Outcome::Refused(reason) => {
                r.refused += 1;
                *r.refused_by_reason.entry(reason).or_default() += 1;
                let _ = self.refused_latency.record(latency_us);
            }
            Outcome::TimedOut => r.timed_out += 1,
            Outcome::Error => r.errors += 1,
        }
    }

    fn report(&self) -> ClassReport {
        ClassReport {
            ok_p50_ms: ms(&self.ok_latency, 0.5),
            ok_p99_ms: ms(&self.ok_latency, 0.99),
            refused_p50_ms: ms(&self.refused_latency, 0.5),
            refused_p99_ms: ms(&self.refused_latency, 0.99),
            ..self.report.clone()
        }
    }
}

impl SecondReport {
    fn empty(second: u32, classes: usize) -> Self {
        let zeros = vec![0; classes];
        SecondReport {
            second,
            sent: zeros.clone(),
            ok: zeros.clone(),
            refused: zeros.clone(),
            timed_out: zeros.clone(),
            errors: zeros,
            ok_mean_ms: 0.0,
        }
    }

    pub fn total(v: &[u64]) -> u64 {
        v.iter().sum()
    }
}

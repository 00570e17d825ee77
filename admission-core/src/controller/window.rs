//! What the controller sees of one closed window, and the detector's verdict on it.

/// What happened in one closed window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WindowSummary {
    /// How long the window was open, in nanoseconds.
    pub duration_ns: u64,
    /// Requests that asked for admission (admitted or not).
    pub arrivals: u64,
    /// Requests the level admitted (in shadow mode: would have admitted).
    pub admitted: u64,
    /// Requests that left the pending queue (queuing samples), dropped ones included.
    pub dispatched: u64,
    /// Of those, how many never reached the app (refused at dequeue or while waiting,
    /// evicted, or their caller left).
    pub dropped: u64,
    /// Mean time those requests waited in the queue, in nanoseconds.
    pub mean_queuing_ns: u64,
    /// Responses the app completed in the window (response headers received).
    pub completed: u64,
    /// The age of the oldest request still waiting when the window closed, in
    /// nanoseconds: a stalled app lets nothing leave the queue, so without it a stall
    /// would look like an idle window.
    pub oldest_waiting_ns: u64,
    /// Requests waiting in the queue when the window closed.
    pub queue_depth: u64,
    /// Closed before its time because the queue grew fast.
    pub early: bool,
    /// How long in the window the pending queue was non-empty (the app busy throughout,
    /// its in-flight limit full), as seen by `observe_queue`, and how many responses the
    /// app completed meanwhile: the app's capacity is their ratio.
    pub busy_ns: u64,
    pub busy_completed: u64,
    /// How long the pending queue had been non-empty without a break, as seen by
    /// `observe_queue`, when the window closed (0 when it was empty): a queue that stood
    /// for a whole nominal window is an overload's, not a burst's.
    pub queue_standing_ns: u64,
}

impl WindowSummary {
    /// What the detector compares with its thresholds: the mean wait of the requests that
    /// left the queue, or the age of the oldest one still in it if that is longer.
    ///
    /// Requests still waiting are samples too, censored: each counts as half the oldest
    /// one's age. In a stall (nothing leaves, the queue grows) they dominate and the
    /// window reads overloaded; in normal operation a few waiters among hundreds of
    /// dispatched requests barely move the mean.
    pub fn queuing_signal_ns(&self) -> u64 {
        queuing_signal_ns(
            self.dispatched,
            self.mean_queuing_ns,
            self.queue_depth,
            self.oldest_waiting_ns,
        )
    }
}

/// The mean wait over `dispatched` requests (mean `mean_ns`) and `waiting` requests still
/// queued, each counted as half the age of the oldest (`oldest_ns`).
pub fn queuing_signal_ns(dispatched: u64, mean_ns: u64, waiting: u64, oldest_ns: u64) -> u64 {
    let waiting = if oldest_ns == 0 { 0 } else { waiting.max(1) };
    let n = dispatched + waiting;
    if n == 0 {
        return 0;
    }
    let sum = dispatched as u128 * mean_ns as u128 + waiting as u128 * (oldest_ns / 2) as u128;
    (sum / n as u128) as u64
}

/// The detector's verdict on a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zone {
    /// Mean queuing above the threshold: cut.
    Cut,
    /// Mean queuing above the threshold, but from a queue the budget absorbs: it formed
    /// within the last nominal window and drains, at the app's completion rate, well within
    /// the budget (a burst, not an overload; see [`super::detector::judge`]). The level
    /// stays where it is: neither cut nor relaxed.
    Absorb,
    /// Between the exit and entry thresholds: keep the level (hysteresis).
    Hold,
    /// At or below the exit threshold: relax.
    Relax,
}

pub(super) fn secs(w: &WindowSummary) -> f64 {
    w.duration_ns.max(1) as f64 / 1e9
}

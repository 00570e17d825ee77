//! One request's turn at the app: the in-flight slot it holds and how the turn ends.
//!
//! - [`AppExchange::done`]: the app's response ended; its duration feeds the app-time
//!   estimate and the slot is released.
//! - [`AppExchange::failed`]: the app failed, timed out, or the response could not be
//!   delivered; the slot is released.
//! - dropped without either: the caller left while the app was working on its request. The
//!   app most likely still is (the connection to it is closed, but an app rarely notices
//!   mid-request), so the slot is held for the app's expected remaining time; releasing it
//!   at once would let the app's own queue grow unseen by the queuing-time detector.

use std::sync::Arc;
use std::time::Instant;

use crate::inflight::Slot;
use crate::shared::Shared;

pub(super) struct AppExchange {
    slot: Option<Slot>,
    dispatched: Instant,
    shared: Arc<Shared>,
}

impl AppExchange {
    pub(super) fn new(slot: Slot, dispatched: Instant, shared: Arc<Shared>) -> Self {
        AppExchange { slot: Some(slot), dispatched, shared }
    }

    pub(super) fn done(mut self) {
        self.shared.app_time.record(self.dispatched.elapsed());
        self.slot = None;
    }

    pub(super) fn failed(mut self) {
        self.slot = None;
    }
}

impl Drop for AppExchange {
    fn drop(&mut self) {
        let Some(slot) = self.slot.take() else { return };
        // An eighth more than typical: holding a little long costs a little throughput only
        // when callers leave; releasing early lets the app's own queue grow.
        let typical = self.shared.app_time.typical();
        let left = (typical + typical / 8).saturating_sub(self.dispatched.elapsed());
        if left.is_zero() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                tokio::time::sleep(left).await;
                drop(slot);
            });
        }
    }
}

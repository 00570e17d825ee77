//! The pending queue is ordered by priority: a freed slot goes to the most important waiting
//! request, and a full queue makes room for a more important newcomer by evicting its least
//! important waiter (refused as overload, never sent to the app). Held requests (`/hold`)
//! instead of timing: the app admits one request at a time and only when the test says so.

use crate::support;

use std::time::Duration;

use support::backend::Backend;
use support::client::{Http1, Resp};
use support::eventually;
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(10);
const TAG: &str = "x-test-tag";
const LEAST_IMPORTANT: &str = "9";
const MOST_IMPORTANT: &str = "0";

fn send(base: &str, business: &'static str, tag: String) -> JoinHandle<Resp> {
    let url = format!("{base}/hold");
    tokio::spawn(async move {
        Http1::new().get(&url, &[("x-business-priority", business), (TAG, tag.as_str())]).await
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn most_important_requests_overtake_the_backlog_and_evict_from_a_full_queue() {
    let app = Backend::start().await;
    let weir = support::sidecar(app.addr, |c| {
        c.inbound.max_inflight = 1;
        c.inbound.max_queued = 5;
        // Only the queue order is under test: no deadline or overload refusals meanwhile.
        c.inbound.task_timeout = Duration::from_secs(30);
        c.inbound.overload_max_wait = Duration::ZERO;
        c.admission.queuing_threshold = Duration::from_secs(60);
        c.admission.queuing_exit_threshold = Duration::from_secs(30);
    });
    let base = format!("http://{}", weir.inbound_addr());

    // The app is busy with one request; a burst of least important requests queues behind it.
    let busy = send(&base, LEAST_IMPORTANT, "busy".into());
    assert!(eventually(WAIT, || app.arrivals() == 1).await, "the app is busy");
    let mut low = Vec::new();
    for i in 0..4 {
        low.push(send(&base, LEAST_IMPORTANT, format!("low{i}")));
        assert!(eventually(WAIT, || weir.status().queue_depth == i + 1).await, "low{i} queued");
    }
    // Most important requests arrive later. The first fits; each further one finds the queue
    // full and evicts the newest least important request.
    let mut high = vec![send(&base, MOST_IMPORTANT, "high0".into())];
    assert!(eventually(WAIT, || weir.status().queue_depth == 5).await, "queue full");
    for (i, evicted) in [(1, 3), (2, 2)] {
        high.push(send(&base, MOST_IMPORTANT, format!("high{i}")));
        let refused = low.pop().unwrap().await.unwrap();
        assert_eq!(refused.status, 503, "low{evicted} evicted");
        assert_eq!(refused.header("x-weir-shed"), Some("overload"));
        refused.level();
        assert!(eventually(WAIT, || weir.status().queue_depth == 5).await, "still full");
    }

    // A newcomer no more important than the least important waiter is refused itself.
    let refused = send(&base, LEAST_IMPORTANT, "late-low".into()).await.unwrap();
    assert_eq!(refused.status, 503);
    assert_eq!(refused.header("x-weir-shed"), Some("overload"));

    app.release(6);
    for task in std::iter::once(busy).chain(high).chain(low) {
        let resp = task.await.unwrap();
        assert_eq!(resp.status, 200);
        resp.level();
    }
    let order: Vec<String> =
        app.seen().iter().map(|s| s.headers[TAG].to_str().unwrap().to_string()).collect();
    assert_eq!(
        order,
        ["busy", "high0", "high1", "high2", "low0", "low1"],
        "most important first, FIFO within a class; evicted and refused never reached the app"
    );
    let counted = || {
        let audit = weir.shared().audit.snapshot();
        audit.classes[9].shed_overload == 3 && audit.classes[0].admitted == 3
    };
    assert!(eventually(WAIT, counted).await, "evictions count as overload refusals");
}

use super::*;

const LOW: Priority = Priority { business: 2, user: 0 };
const HIGH: Priority = Priority { business: 0, user: 0 };

#[tokio::test]
async fn grants_up_to_the_limit_then_queues_fifo_within_a_priority() {
    let limit = InflightLimit::new(2, 8);
    let a = limit.try_slot().unwrap();
    let _b = limit.try_slot().unwrap();
    assert!(limit.try_slot().is_none());
    assert_eq!(limit.inflight(), 2);

    let l1 = limit.clone();
    let first = tokio::spawn(async move { l1.slot(LOW).await.map(|_| 1) });
    while limit.queued() < 1 {
        tokio::task::yield_now().await;
    }
    let l2 = limit.clone();
    let second = tokio::spawn(async move { l2.slot(LOW).await.map(|_| 2) });
    while limit.queued() < 2 {
        tokio::task::yield_now().await;
    }
    drop(a);
    assert_eq!(first.await.unwrap(), Ok(1));
    assert_eq!(second.await.unwrap(), Ok(2));
}

#[tokio::test]
async fn refuses_when_the_queue_is_full() {
    let limit = InflightLimit::new(1, 1);
    let _held = limit.try_slot().unwrap();
    let l = limit.clone();
    let waiter = tokio::spawn(async move { l.slot(LOW).await.is_ok() });
    while limit.queued() < 1 {
        tokio::task::yield_now().await;
    }
    assert_eq!(limit.slot(LOW).await.err(), Some(NoSlot::QueueFull));
    assert_eq!(limit.queued(), 1, "the refused request did not stay queued");
    waiter.abort();
}

#[tokio::test]
async fn leaving_the_queue_frees_its_place() {
    let limit = InflightLimit::new(1, 4);
    let _held = limit.try_slot().unwrap();
    let l = limit.clone();
    let waiter = tokio::spawn(async move { l.slot(LOW).await.is_ok() });
    while limit.queued() < 1 {
        tokio::task::yield_now().await;
    }
    waiter.abort();
    let _ = waiter.await;
    assert_eq!(limit.queued(), 0);
}

#[tokio::test]
async fn limit_grows_and_shrinks_at_run_time() {
    let limit = InflightLimit::new(2, 4);
    let a = limit.try_slot().unwrap();
    let b = limit.try_slot().unwrap();
    limit.set_limit(1);
    assert_eq!(limit.limit(), 1);
    drop(a); // retired, not released
    assert!(limit.try_slot().is_none());
    drop(b);
    let c = limit.try_slot().expect("one slot under the new limit");
    assert!(limit.try_slot().is_none());
    limit.set_limit(3);
    let _d = limit.try_slot().unwrap();
    let _e = limit.try_slot().unwrap();
    assert!(limit.try_slot().is_none());
    assert_eq!(limit.inflight(), 3);
    drop(c);
}

#[tokio::test]
async fn growing_cancels_pending_retirements() {
    let limit = InflightLimit::new(2, 4);
    let a = limit.try_slot().unwrap();
    let b = limit.try_slot().unwrap();
    limit.set_limit(1); // one retirement owed
    limit.set_limit(2); // cancelled
    drop(a);
    drop(b);
    let _x = limit.try_slot().unwrap();
    let _y = limit.try_slot().unwrap();
    assert!(limit.try_slot().is_none());
}

#[tokio::test]
async fn shadow_waits_past_the_bound_and_says_so() {
    let limit = InflightLimit::new(1, 0);
    let held = limit.try_slot().unwrap();
    let l = limit.clone();
    let waiter = tokio::spawn(async move { l.slot_past_bound(LOW, None).await.1 });
    queued_until(&limit, 1).await;
    drop(held);
    assert!(waiter.await.unwrap(), "over the bound");
}

/// Yields until `n` requests wait (the spawned waiters have reached the queue).
async fn queued_until(limit: &InflightLimit, n: usize) {
    while limit.queued() < n {
        tokio::task::yield_now().await;
    }
}

/// Spawns a waiter that reports `tag` once granted (and holds the slot until `release`).
fn waiter(
    limit: &Arc<InflightLimit>,
    priority: Priority,
    tag: u32,
    order: &tokio::sync::mpsc::UnboundedSender<u32>,
) -> tokio::task::JoinHandle<Result<(), NoSlot>> {
    let (limit, order) = (limit.clone(), order.clone());
    tokio::spawn(async move {
        let slot = limit.slot(priority).await?;
        let _ = order.send(tag);
        drop(slot);
        Ok(())
    })
}

#[tokio::test]
async fn the_most_important_waiter_goes_first() {
    let limit = InflightLimit::new(1, 8);
    let held = limit.try_slot().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    // Arrival order: low 1, low 2, high 3, mid 4, high 5.
    let mid = Priority { business: 1, user: 5 };
    for (i, p) in [LOW, LOW, HIGH, mid, HIGH].into_iter().enumerate() {
        tasks.push(waiter(&limit, p, i as u32 + 1, &tx));
        queued_until(&limit, i + 1).await;
    }
    drop(held);
    for t in tasks {
        assert_eq!(t.await.unwrap(), Ok(()));
    }
    let order: Vec<u32> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
    assert_eq!(order, [3, 5, 4, 1, 2], "priority first, FIFO within one");
    assert_eq!(limit.inflight(), 0);
}

#[tokio::test]
async fn a_full_queue_evicts_the_least_important_for_a_more_important_newcomer() {
    let limit = InflightLimit::new(1, 2);
    let held = limit.try_slot().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let older = waiter(&limit, LOW, 1, &tx);
    queued_until(&limit, 1).await;
    let newer = waiter(&limit, LOW, 2, &tx);
    queued_until(&limit, 2).await;
    // Equal priority does not evict.
    assert_eq!(limit.slot(LOW).await.err(), Some(NoSlot::QueueFull));
    // A more important newcomer evicts the least important, newest first among equals.
    let high = waiter(&limit, HIGH, 3, &tx);
    assert_eq!(newer.await.unwrap(), Err(NoSlot::Evicted));
    assert_eq!(limit.queued(), 2);
    drop(held);
    assert_eq!(high.await.unwrap(), Ok(()));
    assert_eq!(older.await.unwrap(), Ok(()));
    let order: Vec<u32> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
    assert_eq!(order, [3, 1]);
}

#[tokio::test]
async fn a_granted_waiter_that_leaves_passes_its_slot_on() {
    let limit = InflightLimit::new(1, 8);
    let held = limit.try_slot().unwrap();
    let first = limit.clone();
    let mut first = Box::pin(async move { first.slot(HIGH).await.is_ok() });
    // Poll once so the request is queued, then let it be granted without polling it again.
    assert!(futures_poll_once(first.as_mut()).await.is_none());
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let second = waiter(&limit, LOW, 2, &tx);
    queued_until(&limit, 2).await;
    drop(held); // granted to `first`, which never looks
    drop(first);
    assert_eq!(second.await.unwrap(), Ok(()));
    assert_eq!(limit.inflight(), 0);
}

/// Polls `f` once: its output if ready.
async fn futures_poll_once<F: Future + Unpin>(mut f: F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        Poll::Ready(match Pin::new(&mut f).poll(cx) {
            Poll::Ready(v) => Some(v),
            Poll::Pending => None,
        })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_releases_and_newcomers_never_strand_a_waiter_nor_pass_the_limit() {
    // The fast paths run without the lock: a release that misses a newcomer entering the
    // queue must still get the slot to it (or every waiter would hang until the timeout).
    const LIMIT: usize = 2;
    let limit = InflightLimit::new(LIMIT, 10_000);
    let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let (limit, peak) = (limit.clone(), peak.clone());
            tokio::spawn(async move {
                for round in 0..200u32 {
                    let p = Priority { business: ((i + round as usize) % 3) as u8, user: 0 };
                    let slot = limit.slot(p).await.expect("the queue is large enough");
                    peak.fetch_max(limit.inflight(), SeqCst);
                    if round % 7 == 0 {
                        tokio::task::yield_now().await;
                    }
                    drop(slot);
                }
            })
        })
        .collect();
    let all = async {
        for t in tasks {
            t.await.unwrap();
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), all)
        .await
        .expect("no waiter stranded");
    assert!(peak.load(SeqCst) <= LIMIT, "peak {}", peak.load(SeqCst));
    assert_eq!((limit.inflight(), limit.queued()), (0, 0));
}

/// A lent slot (its request waits on a downstream) goes to a waiter at once; lent or not,
/// no more than the ceiling are ever held, and returned loans retire as slots are released.
#[tokio::test]
async fn lent_slots_go_to_waiters_within_the_ceiling() {
    let limit = InflightLimit::new(3, 8);
    limit.set_limit(1);
    let a = limit.try_slot().unwrap();
    let l = limit.clone();
    let waiter = tokio::spawn(async move { l.slot(LOW).await.is_ok() });
    while limit.queued() < 1 {
        tokio::task::yield_now().await;
    }
    limit.lend();
    assert!(waiter.await.unwrap(), "the lent slot went to the waiter");
    assert_eq!((limit.inflight(), limit.lent(), limit.held()), (1, 1, 0));
    // The waiter's slot was dropped with its task; take two under the loans.
    let b = limit.try_slot().unwrap();
    limit.lend();
    limit.lend();
    let c = limit.try_slot().unwrap();
    assert!(limit.try_slot().is_none(), "three held: the ceiling, whatever is lent");
    limit.unlend();
    limit.unlend();
    limit.unlend();
    drop(c);
    drop(b);
    assert!(limit.try_slot().is_none(), "one held against a limit of one");
    drop(a);
    assert!(limit.try_slot().is_some());
}

/// A request the level refused takes a slot only while fewer than the idle bound are at
/// the app and nobody waits; never when no bound is set, and never past the limit.
#[tokio::test]
async fn an_idle_slot_goes_only_to_an_idle_worker_with_nobody_waiting() {
    let limit = InflightLimit::new(5, 8);
    assert!(limit.try_idle_slot().is_none(), "no bound set: never");
    limit.set_idle_below(2);
    let first = limit.try_idle_slot().expect("nothing at the app: a worker is idle");
    let second = limit.try_slot().unwrap();
    assert!(limit.try_idle_slot().is_none(), "two at the app: no worker idle");
    drop(second);
    let _third = limit.try_slot().unwrap();
    let _fourth = limit.try_slot().unwrap();
    drop(first);
    assert!(limit.try_idle_slot().is_none(), "still two at the app");
    let fifth = limit.try_slot().unwrap();
    let _sixth = limit.try_slot().unwrap();
    let _seventh = limit.try_slot().unwrap();
    let l = limit.clone();
    let waiter = tokio::spawn(async move { l.slot(HIGH).await.is_ok() });
    while limit.queued() < 1 {
        tokio::task::yield_now().await;
    }
    limit.set_idle_below(8);
    assert!(limit.try_idle_slot().is_none(), "at the limit, and a request waits");
    drop(fifth);
    assert!(waiter.await.unwrap(), "the freed slot went to the waiter");
    // (The waiter is done: its slot is free again, and nobody waits.)
    let _eighth = limit.try_idle_slot().expect("under the limit and the bound, nobody waiting");
    assert!(limit.try_idle_slot().is_none(), "at the limit");
}

use std::time::Duration;

use super::*;

#[tokio::test]
async fn grants_up_to_the_limit_then_queues_fifo() {
    let limit = InflightLimit::new(2, 8);
    let a = limit.try_slot().unwrap();
    let _b = limit.try_slot().unwrap();
    assert!(limit.try_slot().is_none());
    assert_eq!(limit.inflight(), 2);

    let l1 = limit.clone();
    let first = tokio::spawn(async move { l1.slot().await.map(|_| 1) });
    while limit.queued() < 1 {
        tokio::task::yield_now().await;
    }
    let l2 = limit.clone();
    let second = tokio::spawn(async move { l2.slot().await.map(|_| 2) });
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
    let waiter = tokio::spawn(async move { l.slot().await.is_ok() });
    while limit.queued() < 1 {
        tokio::task::yield_now().await;
    }
    assert_eq!(limit.slot().await.err(), Some(QueueFull::Full));
    assert_eq!(limit.queued(), 1, "the refused request did not stay queued");
    waiter.abort();
}

#[tokio::test]
async fn leaving_the_queue_frees_its_place() {
    let limit = InflightLimit::new(1, 4);
    let _held = limit.try_slot().unwrap();
    let l = limit.clone();
    let waiter = tokio::spawn(async move { l.slot().await.is_ok() });
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
    let waiter = tokio::spawn(async move { l.slot_past_bound().await.1 });
    tokio::time::sleep(Duration::from_millis(1)).await;
    drop(held);
    assert!(waiter.await.unwrap(), "over the bound");
}

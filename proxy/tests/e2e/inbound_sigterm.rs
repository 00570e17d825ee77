//! SIGTERM during load: the real `weir` binary stops accepting, finishes every request it
//! had admitted (queued or in flight), and exits 0 within its grace.

use crate::support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::backend::Backend;
use support::client::Http1;

/// `inbound.shutdown_grace`.
const GRACE_SECS: u64 = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_load_loses_no_admitted_request() {
    let app = Backend::start().await;
    app.set_service_time(Duration::from_millis(50));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("weir.yaml");
    // 8 closed-loop callers on 4 slots keep ~4 requests queued for ~50 ms each: past the
    // default 20 ms threshold, so the capacity law would shed within ~100 ms. This test is
    // about the drain, not about shedding: thresholds well above the waits. The grace is
    // far longer than the drain needs (~100 ms), so a drain that waits it out shows.
    std::fs::write(
        &config,
        format!(
            "inbound:\n  listen: 127.0.0.1:0\n  app: {}\n  max_inflight: 4\n  shutdown_grace: {GRACE_SECS}s\n  threads: 2\n\
             admission:\n  queuing_threshold: 1s\n  queuing_exit_threshold: 500ms\n\
             admin:\n  listen: 127.0.0.1:0\nlog:\n  filter: warn\n",
            app.addr
        ),
    )
    .unwrap();
    let mut weir = support::weir_run(&["--config", config.to_str().unwrap()]).await;
    let inbound = weir.listeners.inbound;

    // 8 callers in closed loops against 4 slots: at any moment ~4 in flight, ~4 queued.
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let failed_before_term = Arc::new(AtomicU64::new(0));
    let termed = Arc::new(AtomicBool::new(false));
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let (stop, ok, failed, termed) =
                (stop.clone(), ok.clone(), failed_before_term.clone(), termed.clone());
            let url = format!("http://{inbound}/slow");
            tokio::spawn(async move {
                let client = Http1::new();
                while !stop.load(Relaxed) {
                    match client.send(http::Method::GET, &url, &[], support::client::empty()).await
                    {
                        Ok(resp) if resp.status == 200 => {
                            ok.fetch_add(1, Relaxed);
                        }
                        Ok(resp) => panic!("unexpected status {}", resp.status),
                        Err(_) if termed.load(Relaxed) => break,
                        Err(e) => {
                            failed.fetch_add(1, Relaxed);
                            panic!("failed before SIGTERM: {e}");
                        }
                    }
                }
            })
        })
        .collect();
    assert!(
        support::eventually(Duration::from_secs(20), || ok.load(Relaxed) >= 40).await,
        "load flows"
    );

    termed.store(true, Relaxed);
    let signalled = Instant::now();
    weir.sigterm();
    let mut exit = None;
    while signalled.elapsed() < Duration::from_secs(3 * GRACE_SECS) {
        if let Some(status) = weir.child().try_wait().unwrap() {
            exit = Some(status);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let Some(exit) = exit else {
        panic!("weir did not exit after SIGTERM: {}", weir.stderr());
    };
    let took = signalled.elapsed();
    stop.store(true, Relaxed);
    for c in callers {
        c.await.unwrap();
    }
    assert!(exit.success(), "exit status {exit:?}");
    // Drained, not cut off at the end of the grace: well inside it, whatever the load.
    let half_grace = Duration::from_secs(GRACE_SECS) / 2;
    assert!(took < half_grace, "drained within the grace: {took:?}");
    assert_eq!(failed_before_term.load(Relaxed), 0);
    let arrived = app.arrivals();
    let completed = app.state.completed.load(Relaxed);
    // Every request weir forwarded got its answer back to its caller.
    assert_eq!(arrived, completed, "the app finished everything it got");
    assert_eq!(ok.load(Relaxed), arrived, "no admitted request was lost");
    eprintln!("{arrived} requests served, exit after {took:?}");
}

//! A graceful stop drains the egress after the inbound role: an outbound request in flight
//! finishes with its answer, the egress listener stops taking new connections, and the stop
//! reports that nothing was cut off. Bounded polls, no sleeps as synchronisation.

use crate::support;

use std::time::{Duration, Instant};

use support::backend::Backend;
use support::client::Http1;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_lets_outbound_requests_in_flight_finish_and_takes_no_new_ones() {
    let downstream = Backend::start().await;
    downstream.set_service_time(Duration::from_millis(400));
    let unused = Backend::start().await;
    let sidecar = support::sidecar(unused.addr, |c| {
        c.egress.enabled = true;
        c.egress.listen = "127.0.0.1:0".parse().unwrap();
    });
    let egress = sidecar.egress().unwrap().addr();
    let host = downstream.addr.to_string();

    // One outbound call, in flight at the downstream (it answers after 400 ms).
    let client = Http1::new();
    let call = {
        let (client, host) = (client.clone(), host.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let resp =
                client.get(&format!("http://{egress}/slow"), &[("host", host.as_str())]).await;
            (resp.status, started.elapsed())
        })
    };
    let arrived = support::eventually(Duration::from_secs(5), || downstream.arrivals() >= 1).await;
    assert!(arrived, "the call reached the downstream");

    // Stop while it is in flight (the stop blocks until the drain ends).
    let stopping = tokio::task::spawn_blocking(move || sidecar.stop());

    // The egress listener stops taking connections while the call is still in flight.
    let mut closed = false;
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let attempt = tokio::time::timeout(
            Duration::from_millis(200),
            tokio::net::TcpStream::connect(egress),
        )
        .await;
        if !matches!(attempt, Ok(Ok(_))) {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(closed, "the egress listener closed during the drain");

    let (status, took) = call.await.unwrap();
    assert_eq!(status, 200, "the call in flight got its answer");
    assert!(took >= Duration::from_millis(350), "it was answered by the downstream ({took:?})");
    let drained = tokio::time::timeout(Duration::from_secs(5), stopping)
        .await
        .expect("the stop returns within the grace")
        .unwrap();
    assert!(drained, "the stop reports nothing cut off");
}

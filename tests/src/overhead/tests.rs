use super::*;
use crate::backend::{BackendConfig, CapacityBackend};

const WRK: &str = "Running 3s test @ http://127.0.0.1:8080/
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.02ms  200.00us   5.00ms   90.00%
    Req/Sec    60.00k     1.00k   62.00k    70.00%
  Latency Distribution
     50%  987.00us
     75%    1.10ms
     90%    1.20ms
     99%    2.50ms
  180000 requests in 3.00s, 15.00MB read
Requests/sec:  59999.50
Transfer/sec:      5.00MB
";

#[test]
fn reads_wrk_output() {
    let r = parse_wrk(WRK).unwrap();
    assert_eq!(r.requests, 180_000);
    assert!((r.rps - 59999.5).abs() < 1e-6);
    assert!((r.p50_ms - 0.987).abs() < 1e-9);
    assert!((r.p99_ms - 2.5).abs() < 1e-9);
    assert!((r.seconds - 3.0).abs() < 1e-9);
    assert!(parse_wrk("garbage").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_client_completes_requests_on_both_protocols() {
    let config = BackendConfig::new(1024, Duration::ZERO);
    let backend = CapacityBackend::start(config).await.unwrap();
    for protocol in [Protocol::Http1, Protocol::H2c] {
        let r = closed_loop(backend.addr(), protocol, 4, Duration::from_millis(300)).await.unwrap();
        assert!(r.requests > 10, "{protocol:?}: {r:?}");
        assert_eq!(r.errors, 0);
        assert!(r.p50_ms <= r.p99_ms);
    }
}

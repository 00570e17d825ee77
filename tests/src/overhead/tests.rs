use super::*;

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
    // Refusals are not served requests.
    let refused = WRK.replace("Transfer/sec", "Non-2xx or 3xx responses: 60000\nTransfer/sec");
    let r = parse_wrk(&refused).unwrap();
    assert_eq!((r.requests, r.errors), (120_000, 60_000));
    assert!((r.rps - 40_000.0).abs() < 1e-6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_client_completes_requests_in_every_workload() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = tokio::spawn(serve_zero_work(listener));
    for name in ["http1-c4", "http1-c4-4k", "h2c-c4", "h2c-c20-4k", "h2c-c2x3"] {
        let workload = Workload::parse(name).unwrap();
        let r = closed_loop(addr, workload, Duration::from_millis(300)).await.unwrap();
        assert!(r.requests > 10, "{name}: {r:?}");
        assert_eq!(r.errors, 0, "{name}");
        assert!(r.p50_ms <= r.p99_ms);
    }
    app.abort();
}

#[test]
fn workloads_parse_and_label_round_trip() {
    for w in default_workloads() {
        assert_eq!(Workload::parse(&w.label()).unwrap(), w);
    }
    let w = Workload::parse("http1-c8-4k").unwrap();
    assert_eq!((w.protocol, w.connections, w.body), (Protocol::Http1, 8, BodySize::Kib4));
    assert!(w.wrk_script().unwrap().contains("4096"));
    assert!(Workload::parse("h2c-c64").unwrap().wrk_script().is_none());
    for bad in ["http3-c1", "http1", "http1-c0", "http1-64", "http1-c8-8k", "http1-c8-4k-x"] {
        assert!(Workload::parse(bad).is_err(), "{bad}");
    }
}

fn measurement(round: usize, contender: &str, rps: f64, cpu: f64) -> Measurement {
    Measurement {
        round,
        app: "rust".into(),
        workload: Workload::parse("http1-c64").unwrap(),
        contender: contender.into(),
        client: "wrk".into(),
        result: ClientResult {
            requests: 1000,
            rps,
            p50_ms: 1.0,
            p99_ms: 2.0,
            ..Default::default()
        },
        cpu_us_per_request: Some(cpu),
        idle_rss_mb: Some(10.0),
        loaded_rss_mb: Some(12.0),
        weir_after: None,
    }
}

#[test]
fn medians_are_per_metric_and_ratios_are_to_nginx() {
    assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
    assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
    assert_eq!(median(&[]), None);
    let all = vec![
        measurement(0, "nginx", 100.0, 10.0),
        measurement(0, "weir", 90.0, 30.0),
        measurement(1, "nginx", 120.0, 12.0),
        measurement(1, "weir", 95.0, 11.0),
        measurement(2, "nginx", 110.0, 11.0),
        measurement(2, "weir", 99.0, 12.0),
    ];
    let s = summarise(&all);
    assert_eq!(s.len(), 2);
    let weir = &s[1];
    assert_eq!(weir.contender, "weir");
    assert_eq!(weir.rounds, 3);
    // Each metric's own median, not the median round's: rps 95 (round 1), CPU 12 (round 2).
    assert_eq!(weir.rps, 95.0);
    assert_eq!(weir.cpu_us_per_request, Some(12.0));
    assert!((weir.rps_spread - 9.0 / 95.0).abs() < 1e-9);
    let table = markdown(&s);
    // rps vs nginx 95/110, CPU vs nginx 12/11.
    assert!(table.contains("| 0.86 |"), "{table}");
    assert!(table.contains("| 1.09 |"), "{table}");
}

const H2LOAD: &str = "Main benchmark duration is over for thread #0. Stopping all clients.
finished in 5.01s, 40000.00 req/s, 2.65MB/s
requests: 200003 total, 200004 started, 200003 done, 200000 succeeded, 3 failed, 3 errored, 0 timeout
status codes: 200000 2xx, 0 3xx, 0 4xx, 0 5xx
";

#[test]
fn reads_h2load_output_and_its_log() {
    // start, status, us to the end; the last line was cut off by the duration's end.
    let log = "1\t200\t100\n2\t200\t300\n3\t503\t50\n4\t200\t200\n5\t-1\t0\n";
    let r = parse_h2load(H2LOAD, log).unwrap();
    assert!((r.rps - 3.0 / 5.01).abs() < 1e-9, "2xx only");
    assert!((r.seconds - 5.01).abs() < 1e-9);
    assert_eq!(r.requests, 3);
    assert_eq!((r.errors, r.refused), (1, 1), "the 503");
    assert!((r.p50_ms - 0.2).abs() < 1e-3, "{r:?}");
    assert!((r.p99_ms - 0.3).abs() < 1e-3, "{r:?}");
    assert!(parse_h2load("garbage", "").is_none());
}

#[test]
fn h2c_workloads_may_name_their_streams_per_connection() {
    let w = Workload::parse("h2c-c32x10").unwrap();
    assert_eq!((w.connections, w.streams), (32, Some(10)));
    assert_eq!(w.label(), "h2c-c32x10");
    assert_eq!(Workload::parse("h2c-c64").unwrap().streams, None);
    for bad in ["http1-c32x10", "h2c-c32x0", "h2c-c32x", "h2c-cx10"] {
        assert!(Workload::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn per_round_ratios_take_each_rounds_nginx() {
    // The machine slows down in round 2: per-round ratios see weir at 0.9x both times.
    let all = vec![
        measurement(1, "nginx", 100.0, 10.0),
        measurement(1, "weir", 90.0, 11.0),
        measurement(2, "nginx", 50.0, 20.0),
        measurement(2, "weir", 45.0, 22.0),
    ];
    let s = summarise(&all);
    let weir = s.iter().find(|m| m.contender == "weir").unwrap();
    assert!((weir.rps_vs_nginx_per_round.unwrap() - 0.9).abs() < 1e-9);
    assert!((weir.cpu_vs_nginx_per_round.unwrap() - 1.1).abs() < 1e-9);
}

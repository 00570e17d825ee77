use super::*;
use crate::backend::{BackendConfig, CapacityBackend};

/// Poisson arrivals at 500/s for 1 s: the count is within 5 sigma (sigma = sqrt(500)),
/// and the class mix roughly follows the weights.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poisson_count_and_mix_are_within_bounds() {
    let config = BackendConfig::new(256, Duration::from_millis(1));
    let backend = CapacityBackend::start(config).await.unwrap();
    let phases = vec![Phase { rate_per_sec: 500.0, duration: Duration::from_secs(1) }];
    let report = run(LoadSpec::new(backend.addr(), phases)).await.unwrap();
    let sent = report.sent();
    assert!((388..=612).contains(&sent), "sent {sent}");
    assert_eq!(report.ok(), sent, "{report:?}");
    let critical = report.classes[0].sent as f64 / sent as f64;
    let background = report.classes[2].sent as f64 / sent as f64;
    assert!((0.04..0.18).contains(&critical), "critical share {critical}");
    assert!((0.5..0.7).contains(&background), "background share {background}");
    let seconds: u64 = report.series.iter().map(|s| SecondReport::total(&s.sent)).sum();
    assert_eq!(seconds, sent);
}

#[test]
fn classes_are_picked_by_weight() {
    let classes = default_classes();
    assert_eq!(pick_class(&classes, 1.0, 0.0), 0);
    assert_eq!(pick_class(&classes, 1.0, 0.099), 0);
    assert_eq!(pick_class(&classes, 1.0, 0.2), 1);
    assert_eq!(pick_class(&classes, 1.0, 0.5), 2);
    assert_eq!(pick_class(&classes, 1.0, 0.9999), 2);
}

#[test]
fn refusals_are_recognised() {
    let parts = |status: u16, headers: &[(&str, &str)]| {
        let mut builder = http::Response::builder().status(status);
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        builder.body(()).unwrap().into_parts().0
    };
    let shed = parts(503, &[("x-weir-shed", "overload")]);
    assert_eq!(Outcome::classify(&shed, None), Outcome::Refused("overload".into()));
    assert_eq!(Outcome::classify(&parts(503, &[]), None), Outcome::Refused("unlabelled".into()));
    let grpc = parts(200, &[("grpc-status", "8"), ("x-weir-shed", "deadline")]);
    assert_eq!(Outcome::classify(&grpc, None), Outcome::Refused("deadline".into()));
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("8"));
    assert!(matches!(Outcome::classify(&parts(200, &[]), Some(&trailers)), Outcome::Refused(_)));
    assert_eq!(Outcome::classify(&parts(200, &[]), None), Outcome::Ok);
    assert_eq!(Outcome::classify(&parts(500, &[]), None), Outcome::Error);
}

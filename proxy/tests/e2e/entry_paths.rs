//! The entry sidecar classifies the normalised path and forwards that same path, so a
//! client cannot borrow a more important rule's class by spelling its path through that
//! rule's prefix; ambiguous spellings are refused with 400 and never reach the app.

use crate::support;

use std::time::Duration;

use support::backend::Backend;
use support::client::{Http1, H2};

const TABLE: &str = "default_business: 200
rules:
  - name: pay
    match: { path_prefix: /api/pay/ }
    business: 1
  - name: admin
    match: { path_prefix: /admin }
    business: 50
";

fn entry(app: &Backend, dir: &tempfile::TempDir) -> weir_proxy::Sidecar {
    let table = dir.path().join("table.yaml");
    let secret = dir.path().join("secret");
    std::fs::write(&table, TABLE).unwrap();
    std::fs::write(&secret, "entry-paths-secret\n").unwrap();
    support::sidecar(app.addr, |c| {
        c.inbound.entry = true;
        c.admin.table_file = Some(table);
        c.admin.user_secret_file = Some(secret);
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dot_segments_and_escapes_are_stamped_by_the_normalised_path() {
    let app = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let weir = entry(&app, &dir);
    let base = format!("http://{}", weir.inbound_addr());
    let claims = [("x-business-priority", "0"), ("x-user-priority", "0")];
    for client in [Http1::new(), H2::new()] {
        for (raw, forwarded, business) in [
            ("/api/pay/ok", "/api/pay/ok", "1"),
            ("/api/pay/../../admin/delete", "/admin/delete", "50"),
            ("/api/pay/%2e%2e/%2e%2e/admin", "/admin", "50"),
            ("/api/pay/%2E%2e/%2e%2E/admin/x?y=1", "/admin/x", "50"),
            ("//api///pay//%6Fk", "/api/pay/ok", "1"),
            ("/api/pay/./../other", "/api/other", "200"),
        ] {
            let before = app.arrivals();
            let resp = client.get(&format!("{base}{raw}"), &claims).await;
            assert_eq!(resp.status, 200, "{raw}");
            assert_eq!(app.arrivals(), before + 1, "{raw}");
            let seen = app.seen().pop().unwrap();
            assert_eq!(seen.path, forwarded, "{raw}: the app gets the path that was classified");
            assert_eq!(seen.headers["x-business-priority"], business, "{raw}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_paths_are_refused_before_the_app() {
    let app = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let weir = entry(&app, &dir);
    let base = format!("http://{}", weir.inbound_addr());
    for client in [Http1::new(), H2::new()] {
        for raw in [
            "/api/pay/..%2F..%2Fadmin",
            "/api/pay%2fx",
            "/api/pay/../../../admin",
            "/%2e%2e/admin",
            "/api/pay/..;/..;/admin",
            "/api/pay/%zz",
            "/api/pay/%00",
        ] {
            let resp = tokio::time::timeout(
                Duration::from_secs(10),
                client.get(&format!("{base}{raw}"), &[]),
            )
            .await
            .unwrap_or_else(|_| panic!("{raw}: answered in time"));
            assert_eq!(resp.status, 400, "{raw}");
            assert!(resp.header("x-weir-shed").is_none(), "{raw}: a refusal, not a shed");
        }
    }
    assert_eq!(app.arrivals(), 0, "nothing ambiguous reached the app");
}

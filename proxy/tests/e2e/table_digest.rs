//! `weir_table_info{digest,version}`: sidecars serving the same rules show the same digest
//! (whatever their versions), and a change of rules through the control API changes it, so
//! a fleet can be checked for agreement with one query
//! (`count(count by (digest) (weir_table_info)) > 1`).

use crate::support;

use http::Method;
use support::client::{bytes_body, Http1};

fn info(metrics: &str) -> (String, String) {
    let line = metrics
        .lines()
        .find(|l| l.starts_with("weir_table_info{"))
        .unwrap_or_else(|| panic!("no weir_table_info in\n{metrics}"));
    assert!(line.ends_with("} 1"), "{line}");
    let label = |name: &str| {
        let start = line.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
        line[start..].split('"').next().unwrap().to_string()
    };
    (label("digest"), label("version"))
}

const TABLE: &str = "version: 7\ndefault_business: 200\nrules:\n  - name: pay\n    match: { path_prefix: /pay/ }\n    business: 10\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_table_digest_agrees_across_sidecars_and_follows_the_rules() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "digest-test-token\n").unwrap();
    let table = dir.path().join("table.yaml");
    std::fs::write(&table, TABLE).unwrap();
    // Same rules at another version: the digest leaves the version out.
    let table_v9 = dir.path().join("table-v9.yaml");
    std::fs::write(&table_v9, TABLE.replace("version: 7", "version: 9")).unwrap();
    let app = "127.0.0.1:9".parse().unwrap();
    let a = support::sidecar(app, |c| {
        c.admin.table_file = Some(table.clone());
        c.admin.token_file = Some(token.clone());
    });
    let b = support::sidecar(app, |c| c.admin.table_file = Some(table_v9.clone()));
    let default = support::sidecar(app, |_| {});

    let (digest_a, version_a) = info(&support::metrics_text(a.admin_addr()).await);
    let (digest_b, version_b) = info(&support::metrics_text(b.admin_addr()).await);
    let (digest_default, _) = info(&support::metrics_text(default.admin_addr()).await);
    assert!(digest_a.starts_with("sha256:") && digest_a.len() == 7 + 64, "{digest_a}");
    assert_eq!(digest_a, digest_b, "same rules, same digest");
    assert_eq!((version_a.as_str(), version_b.as_str()), ("7", "9"));
    assert_ne!(digest_a, digest_default, "other rules, other digest");

    // A rule changed through the control API: a new digest (and version).
    let changed = TABLE.replace("business: 10", "business: 11");
    let resp = Http1::new()
        .send(
            Method::PUT,
            &format!("http://{}/v1/priority-table", a.admin_addr()),
            &[
                ("authorization", "Bearer digest-test-token"),
                ("content-type", "application/yaml"),
                ("if-match", "\"7\""),
            ],
            bytes_body(changed),
        )
        .await
        .expect("control API answers");
    assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
    let (digest_after, version_after) = info(&support::metrics_text(a.admin_addr()).await);
    assert_ne!(digest_after, digest_a);
    assert_eq!(version_after, "8");
}

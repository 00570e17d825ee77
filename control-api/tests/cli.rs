//! The CLI client functions against a real admin API.

mod common;

use admission_core::audit::Outcome;
use control_api::cli::{audit_text, status_text, table_text, ClientArgs, TableCommand};

struct Fixture {
    runtime: tokio::runtime::Runtime,
    server: Option<common::Server>,
    args: ClientArgs,
}

impl Fixture {
    fn new() -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let server = runtime.block_on(common::start());
        let args = ClientArgs {
            admin: server.addr.to_string(),
            token_file: Some(server.path("token")),
            json: false,
        };
        Fixture { runtime, server: Some(server), args }
    }

    fn server(&self) -> &common::Server {
        self.server.as_ref().unwrap()
    }

    fn file(&self, name: &str, text: &str) -> std::path::PathBuf {
        let path = self.server().path(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            self.runtime.block_on(s.stop());
        }
    }
}

#[test]
fn get_edit_put_round_trip_and_lost_update() {
    let f = Fixture::new();
    let yaml = table_text(&f.args, &TableCommand::Get).unwrap();
    assert!(yaml.contains("version: 1"), "{yaml}");
    let edited =
        f.file("edited.yaml", &yaml.replace("default_business: 200", "default_business: 150"));
    let out =
        table_text(&f.args, &TableCommand::Put { file: edited.clone(), if_match: None }).unwrap();
    assert_eq!(out, "accepted: the table is now version 2 (3 rules)\n");

    // The same edit again is based on version 1: refused, nothing lost.
    let e = table_text(&f.args, &TableCommand::Put { file: edited.clone(), if_match: None })
        .unwrap_err();
    assert_eq!(e.code, 75, "{}", e.message);
    assert!(e.message.contains("current version is 2"), "{}", e.message);

    let json = ClientArgs { json: true, ..f.args.clone() };
    let current: serde_json::Value =
        serde_json::from_str(&table_text(&json, &TableCommand::Get).unwrap()).unwrap();
    assert_eq!(
        (current["version"].as_u64(), current["default_business"].as_u64()),
        (Some(2), Some(150))
    );

    let out = table_text(&f.args, &TableCommand::Put { file: edited, if_match: Some(2) }).unwrap();
    assert!(out.contains("version 3"), "{out}");
}

#[test]
fn put_errors_have_clear_messages_and_exit_codes() {
    let f = Fixture::new();
    let invalid = f.file(
        "invalid.yaml",
        "version: 1\ndefault_business: 300\nrules:\n  - { name: a, match: {}, business: 1 }\n",
    );
    let e = table_text(&f.args, &TableCommand::Put { file: invalid, if_match: None }).unwrap_err();
    assert_eq!(e.code, 65);
    assert!(e.message.contains("default_business: 300 is out of range"), "{}", e.message);
    assert!(e.message.contains("rules[0].match: empty match"), "{}", e.message);

    let unversioned = f.file("nover.yaml", "default_business: 3\n");
    let e =
        table_text(&f.args, &TableCommand::Put { file: unversioned, if_match: None }).unwrap_err();
    assert_eq!(e.code, 65);
    assert!(e.message.contains("--if-match"), "{}", e.message);

    let good = f.file("good.json", r#"{"version": 1, "default_business": 3}"#);
    let anonymous = ClientArgs { token_file: None, ..f.args.clone() };
    let e = table_text(&anonymous, &TableCommand::Put { file: good.clone(), if_match: None })
        .unwrap_err();
    assert_eq!(e.code, 77);
    assert!(e.message.contains("--token-file"), "{}", e.message);

    let e = table_text(
        &f.args,
        &TableCommand::Put { file: f.server().path("missing.yaml"), if_match: None },
    )
    .unwrap_err();
    assert_eq!(e.code, 66);

    let out = table_text(&f.args, &TableCommand::Put { file: good, if_match: None }).unwrap();
    assert!(out.contains("version 2"), "{out}");
}

#[test]
fn validate_status_and_audit_render() {
    let f = Fixture::new();
    let good = f.file("t.yaml", &common::table_yaml(9));
    let out = table_text(&f.args, &TableCommand::Validate { file: good }).unwrap();
    assert!(out.ends_with("valid (2 rules; least important business class 9)\n"), "{out}");
    let bad = f.file("bad.yaml", "rules:\n  - { name: a, match: { path: x }, business: 1 }\n");
    let e = table_text(&f.args, &TableCommand::Validate { file: bad }).unwrap_err();
    assert_eq!(e.code, 65);
    assert!(e.message.contains("rules[0].match.path: `x` must start with `/`"), "{}", e.message);

    let status = status_text(&f.args).unwrap();
    assert!(
        status.starts_with("level       255.127 (compound 32767)   overloaded: no"),
        "{status}"
    );
    assert!(status.contains("in flight   3/64"), "{status}");

    for _ in 0..80 {
        f.server().audit.record(0, Outcome::Admitted);
    }
    for _ in 0..20 {
        f.server().audit.record(200, Outcome::ShedOverload);
    }
    let audit = audit_text(&f.args).unwrap();
    assert!(audit.contains("! top_class_share"), "{audit}");
    assert!(
        audit.contains("       200         20          0         20          0   20.0%"),
        "{audit}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&audit_text(&ClientArgs { json: true, ..f.args.clone() }).unwrap())
            .unwrap();
    assert_eq!(json["last_1m"]["total_seen"], 100);
}

#[test]
fn unreachable_api_is_exit_69() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let args = ClientArgs { admin: port.to_string(), token_file: None, json: false };
    let e = status_text(&args).unwrap_err();
    assert_eq!(e.code, 69);
    assert!(e.message.contains("cannot reach the admin API"), "{}", e.message);
}

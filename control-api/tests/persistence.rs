//! State-file crash safety, start-up precedence and the ConfigMap-style table file.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use admission_core::table::PriorityTable;
use common::Server;
use control_api::{load_initial_table, AdminConfig, StateFile, TableStore};
use http::StatusCode;
use rand::Rng;

const CHILD_ENV: &str = "WEIR_PERSIST_CHILD_STATE";

/// A table big enough (tens of KB) that a torn write would be caught: `version`
/// determines both the rule count and every rule's business.
fn big_table(version: u64) -> PriorityTable {
    let business = (version % 200) as u8;
    let count = 200 + (version % 50) as usize;
    let rules = (0..count)
        .map(|i| format!("  - {{ name: r{i}, match: {{ path: /endpoint/{i}, method: GET }}, business: {business} }}\n"))
        .collect::<String>();
    let yaml = format!("version: {version}\ndefault_business: {business}\nrules:\n{rules}");
    PriorityTable::from_yaml(&yaml).unwrap()
}

fn check_consistent(table: &PriorityTable) {
    let business = (table.version % 200) as u8;
    assert_eq!(table.rules.len(), 200 + (table.version % 50) as usize, "version {}", table.version);
    assert_eq!(table.default_business, business);
    assert!(table.rules.iter().all(|r| r.business == business));
    table.compile().expect("a persisted table is valid");
}

/// Not a test on its own: the child process of the crash test. Persists tables in a
/// loop through the real store + state file until it is killed.
#[test]
fn persist_child_process() {
    let Ok(path) = std::env::var(CHILD_ENV) else { return };
    let state = StateFile::new(&path);
    // Like a restart: the previous state must load.
    let start =
        state.read().expect("state readable at restart").map(|p| p.table.version).unwrap_or(0);
    let store = TableStore::new(big_table(start).compile().unwrap());
    for i in 0.. {
        let v = store.version();
        store
            .swap(big_table(v + 1), Some(v), |c| state.write(c.source(), Some(c.version())))
            .unwrap();
        if i == 0 {
            println!("persisting");
        }
    }
}

#[test]
fn sigkill_during_persistence_always_leaves_a_valid_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.yaml");
    let mut rng = rand::rng();
    let mut versions = Vec::new();
    let mut torn_temp_files = 0;
    const KILLS: usize = 25;
    for _ in 0..KILLS {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "persist_child_process", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Wait (bounded) until the child is inside the write loop.
        let stdout = child.stdout.take().unwrap();
        let (started_tx, started) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
            if lines.any(|l| l.ends_with("persisting")) {
                let _ = started_tx.send(());
            }
            lines.for_each(drop); // keep draining so the child never blocks on a full pipe
        });
        if started.recv_timeout(Duration::from_secs(30)).is_err() {
            child.kill().unwrap();
            panic!("child never started persisting");
        }
        // A random kill point inside the loop.
        std::thread::sleep(Duration::from_micros(rng.random_range(0..20_000)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();

        // A leftover temp file means the kill landed inside a write, before the rename.
        torn_temp_files += usize::from(dir.path().join("state.yaml.tmp").exists());
        let persisted = StateFile::new(&path).read().expect("state file parses").expect("exists");
        check_consistent(&persisted.table);
        assert_eq!(persisted.table_file_digest, Some(persisted.table.version));
        versions.push(persisted.table.version);
    }
    assert!(versions.windows(2).all(|w| w[0] < w[1]), "each restart continued: {versions:?}");
    eprintln!(
        "{KILLS} SIGKILLs ({torn_temp_files} left a temp file behind, i.e. hit mid-write); \
         persisted versions reached {}",
        versions.last().unwrap()
    );
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

fn cfg_in(dir: &Path) -> AdminConfig {
    AdminConfig {
        state_path: Some(dir.join("state.yaml")),
        table_file: Some(dir.join("table.yaml")),
        ..AdminConfig::default()
    }
}

#[test]
fn startup_precedence() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let only_state =
        AdminConfig { state_path: Some(d.join("state.yaml")), ..AdminConfig::default() };

    // Nothing configured: the embedded default, persisted.
    let t = load_initial_table(&only_state, b"").unwrap();
    assert_eq!((t.version(), t.source().default_business), (1, 200));
    assert!(d.join("state.yaml").exists());

    // The table file is recorded in the state with its digest.
    std::fs::remove_file(d.join("state.yaml")).unwrap();
    write(&d.join("table.yaml"), "version: 5\ndefault_business: 50\n");
    let cfg = cfg_in(d);
    let t = load_initial_table(&cfg, b"").unwrap();
    assert_eq!((t.version(), t.source().default_business), (5, 50));

    // An API edit (state newer than the unchanged table file) survives a restart.
    let state = StateFile::new(d.join("state.yaml"));
    let digest = state.read().unwrap().unwrap().table_file_digest;
    let mut edited = PriorityTable::from_yaml("version: 6\ndefault_business: 60\n").unwrap();
    state.write(&edited, digest).unwrap();
    let t = load_initial_table(&cfg, b"").unwrap();
    assert_eq!((t.version(), t.source().default_business), (6, 60), "state wins");

    // The ConfigMap changed while down: the table file wins, at a newer version.
    write(&d.join("table.yaml"), "version: 2\ndefault_business: 20\n");
    let t = load_initial_table(&cfg, b"").unwrap();
    assert_eq!((t.version(), t.source().default_business), (7, 20), "changed file wins");

    // An invalid table file never replaces a good state.
    edited.version = 8;
    state.write(&edited, None).unwrap();
    write(&d.join("table.yaml"), "default_business: 999\n");
    let t = load_initial_table(&cfg, b"").unwrap();
    assert_eq!(t.source().default_business, 60);

    // A torn state falls back to the table file; with the file invalid too, start fails.
    write(&d.join("state.yaml"), "rules: [ { name: x");
    let err = load_initial_table(&cfg, b"").unwrap_err();
    assert!(err.to_string().contains("table.yaml"), "{err}");
    write(&d.join("table.yaml"), "default_business: 30\n");
    assert_eq!(load_initial_table(&cfg, b"").unwrap().source().default_business, 30);
}

#[tokio::test]
async fn an_accepted_put_survives_a_restart() {
    let (mut cfg, dir) = common::config();
    cfg.state_path = Some(dir.path().join("state.yaml"));
    let s = common::start_with(cfg.clone(), dir).await;
    assert_eq!(s.put_table(&common::table_yaml(33), "\"1\"").await.status, StatusCode::OK);
    // The server's temp dir goes away with it: keep a copy of the state it persisted.
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(s.path("state.yaml"), dir.path().join("state.yaml")).unwrap();
    s.stop().await;
    cfg.state_path = Some(dir.path().join("state.yaml"));
    let t = load_initial_table(&cfg, b"").unwrap();
    assert_eq!((t.version(), t.source().default_business), (2, 33));
}

/// Kubernetes' atomic writer: data in a timestamped dir, `..data` links to it, the file
/// links through `..data`; an update makes a new dir and renames a new `..data` link over.
fn configmap_swap(dir: &Path, generation: u32, content: &str) {
    let data = dir.join(format!("..gen_{generation}"));
    std::fs::create_dir(&data).unwrap();
    write(&data.join("table.yaml"), content);
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(format!("..gen_{generation}"), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    if generation == 0 {
        std::os::unix::fs::symlink("..data/table.yaml", dir.join("table.yaml")).unwrap();
    } else {
        std::fs::remove_dir_all(dir.join(format!("..gen_{}", generation - 1))).unwrap();
    }
}

async fn wait_for<F: Fn(u8) -> bool>(s: &Server, within: Duration, done: F) -> Duration {
    let start = Instant::now();
    loop {
        let (_, table) = s.current_table().await;
        if done(table.default_business) {
            return start.elapsed();
        }
        assert!(start.elapsed() < within, "not picked up within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn configmap_symlink_swap_is_picked_up_within_two_seconds() {
    let (mut cfg, dir) = common::config();
    let mount = dir.path().join("mount");
    std::fs::create_dir(&mount).unwrap();
    configmap_swap(&mount, 0, "default_business: 10\n");
    cfg.table_file = Some(mount.join("table.yaml"));
    cfg.state_path = Some(dir.path().join("state.yaml"));
    let s = common::start_with(cfg, dir).await;
    assert_eq!(s.current_table().await.1.default_business, 10);

    configmap_swap(&mount, 1, "default_business: 11\n");
    let took = wait_for(&s, Duration::from_secs(2), |b| b == 11).await;
    eprintln!("symlink swap picked up after {took:?}");
    assert_eq!(s.current_table().await.0, 2);
    // Persisted, with the file's digest.
    let persisted = StateFile::new(s.path("state.yaml")).read().unwrap().unwrap();
    assert_eq!(persisted.table.default_business, 11);

    // An API edit applies on top...
    assert_eq!(s.put_table(&common::table_yaml(12), "\"2\"").await.status, StatusCode::OK);
    // ...an invalid file is ignored (and counted)...
    configmap_swap(&mount, 2, "default_business: 1000\n");
    let start = Instant::now();
    loop {
        let metrics = s.get("/metrics").await.body;
        if metrics.contains("weir_priority_table_file_rejected_total 1") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(2), "rejection not seen: {metrics}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(s.current_table().await.1.default_business, 12);
    // ...and the next valid content of the file wins over the API edit.
    configmap_swap(&mount, 3, "default_business: 13\n");
    wait_for(&s, Duration::from_secs(2), |b| b == 13).await;
    assert_eq!(s.current_table().await.0, 4);
    s.stop().await;
}

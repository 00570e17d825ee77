//! Starting one contender's call graph: the apps (tasks of this process), and in front of
//! each the contender's proxy (child processes), wired so every app calls its downstreams
//! either through its own sidecar's egress (routed by `Host`) or straight at their front.
//!
//! ```text
//! clients -> [E's front] -> app E (gateway) -> [A's front] -> app A -+-> [B's front] -> app B (bottleneck)
//!                                                                   +-> [C's front] -> app C (healthy)
//! ```

use serde::Serialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::app::{Downstream, HopApp, HopAppConfig};
use crate::backend::{BackendConfig, CapacityBackend};
use crate::contender::{self, Contender, Kind};
use crate::load::Protocol;
use weir_workload::backend::HttpServer;

/// What sits in front of each app.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Topology {
    /// No proxies: clients call app E, apps call each other.
    Direct,
    /// weir's inbound role at every hop (E as the entry), no egress.
    Inbound,
    /// weir's inbound role at every hop and the egress role at E and A with per-route levels
    /// off (`egress.per_route.enabled: false`): each caches its downstream's level one hop
    /// away (what weir shipped before per-route levels).
    OneHop,
    /// The per-route level of issue 19 (a level per route that travels upstream): the egress
    /// role at E and A with weir's shipped defaults, which turn it on ([`MultihopHook`]:
    /// the binary and an optional overlay).
    Multihop,
    /// HAProxy in front of every app, `maxconn` = the app's workers (a priority queue by
    /// `x-business-priority`, as `contender.rs` sets it up for the overload benchmark).
    Haproxy,
}

impl Topology {
    pub fn label(self) -> &'static str {
        match self {
            Topology::Direct => "direct",
            Topology::Inbound => "inbound-only",
            Topology::OneHop => "one-hop-egress",
            Topology::Multihop => "multihop",
            Topology::Haproxy => "haproxy",
        }
    }

    fn weir(self) -> bool {
        matches!(self, Topology::Inbound | Topology::OneHop | Topology::Multihop)
    }

    fn egress(self) -> bool {
        matches!(self, Topology::OneHop | Topology::Multihop)
    }
}

/// The hook the per-route multi-hop contender plugs into: YAML merged (deep, mapping by
/// mapping) over each sidecar's one-hop-egress configuration, and the `weir` binary that
/// understands it. The overlay file has up to five keys: `all` (every sidecar), then `e`,
/// `a`, `b`, `c` (one hop each, merged after `all`).
#[derive(Clone, Debug)]
pub struct MultihopHook {
    pub weir_bin: PathBuf,
    pub overlay_file: PathBuf,
    overlay: serde_yaml::Value,
}

/// What the one-hop contender merges over its egress hops: per-route levels off.
const ONE_HOP_ONLY: &str = "egress:\n  per_route:\n    enabled: false\n";

impl MultihopHook {
    /// weir's shipped defaults (per-route levels come on with the egress role): no overlay.
    pub fn shipped(weir_bin: PathBuf) -> Self {
        MultihopHook {
            weir_bin,
            overlay_file: PathBuf::from("(none: shipped defaults)"),
            overlay: serde_yaml::Value::Mapping(Default::default()),
        }
    }

    pub fn load(weir_bin: PathBuf, overlay_file: PathBuf) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(&overlay_file)
            .map_err(|e| anyhow::anyhow!("{}: {e}", overlay_file.display()))?;
        let overlay: serde_yaml::Value = serde_yaml::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}: {e}", overlay_file.display()))?;
        let serde_yaml::Value::Mapping(map) = &overlay else {
            anyhow::bail!("{}: expected a mapping with keys all/e/a/b/c", overlay_file.display());
        };
        for key in map.keys() {
            let name = key.as_str().unwrap_or("(not a string)");
            anyhow::ensure!(
                ["all", "e", "a", "b", "c"].contains(&name),
                "{}: unknown key `{name}` (expected all, e, a, b, c)",
                overlay_file.display()
            );
        }
        Ok(MultihopHook { weir_bin, overlay_file, overlay })
    }

    /// `base` with the `all` and `hop` overlays merged over it.
    fn apply(&self, hop: &str, base: &str) -> anyhow::Result<String> {
        let mut config: serde_yaml::Value = serde_yaml::from_str(base)?;
        for key in ["all", hop] {
            if let Some(part) = self.overlay.get(key) {
                merge(&mut config, part);
            }
        }
        Ok(serde_yaml::to_string(&config)?)
    }
}

/// Deep merge: mappings key by key, anything else replaced.
fn merge(base: &mut serde_yaml::Value, overlay: &serde_yaml::Value) {
    match (base, overlay) {
        (serde_yaml::Value::Mapping(b), serde_yaml::Value::Mapping(o)) => {
            for (k, v) in o {
                match b.get_mut(k) {
                    Some(existing) => merge(existing, v),
                    None => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// The apps of one graph.
#[derive(Clone, Debug, Serialize)]
pub struct Apps {
    /// The gateway behind the entry: this many workers, no work of its own.
    pub e_workers: usize,
    /// The costly middle hop: workers, and the time each request holds one before calling.
    pub a_workers: usize,
    #[serde(serialize_with = "crate::report::ser_millis")]
    pub a_work: Duration,
    pub b: BackendConfig,
    pub c: BackendConfig,
}

/// The entry's priority table: the class is the path's second segment, for both APIs.
const TABLE: &str = "default_business: 2
rules:
  - name: x-critical
    match: { path_prefix: /x/critical }
    business: 0
  - name: x-normal
    match: { path_prefix: /x/normal }
    business: 1
  - name: x-background
    match: { path_prefix: /x/background }
    business: 2
  - name: y-critical
    match: { path_prefix: /y/critical }
    business: 0
  - name: y-normal
    match: { path_prefix: /y/normal }
    business: 1
  - name: y-background
    match: { path_prefix: /y/background }
    business: 2
";

/// A running graph. Dropping it stops every proxy and app.
pub struct Graph {
    /// Where clients send.
    pub entry: SocketAddr,
    /// weir's admin address per hop (`e`, `a`, `b`, `c`), for the weir topologies.
    pub admins: BTreeMap<&'static str, SocketAddr>,
    /// The authority each hop is called by (its front): what an upstream egress caches.
    pub authorities: BTreeMap<&'static str, String>,
    pub app_e: Arc<HopApp>,
    pub app_a: Arc<HopApp>,
    pub b: Arc<CapacityBackend>,
    pub c: Arc<CapacityBackend>,
    // Dropped in declaration order: proxies first, then the apps' accept loops.
    _proxies: Vec<Contender>,
    /// The apps' servers: dropping one stops it.
    _guards: Vec<HttpServer>,
    _dir: tempfile::TempDir,
}

/// A proxy in front of one app, and where the upstream reaches it.
struct Front {
    addr: SocketAddr,
    proxy: Option<Contender>,
}

impl Graph {
    pub async fn start(
        topology: Topology,
        apps: &Apps,
        k: usize,
        weir_bin: &Path,
        hook: Option<&MultihopHook>,
    ) -> anyhow::Result<Graph> {
        anyhow::ensure!(
            topology != Topology::Multihop || hook.is_some(),
            "the multihop contender needs its configuration hook"
        );
        let weir_bin = match (topology, hook) {
            (Topology::Multihop, Some(h)) => h.weir_bin.clone(),
            _ => weir_bin.to_path_buf(),
        };
        let dir = tempfile::tempdir()?;
        let table = dir.path().join("table.yaml");
        let secret = dir.path().join("secret");
        std::fs::write(&table, TABLE)?;
        std::fs::write(&secret, "multihop-bench-secret\n")?;
        let starter = Starter { topology, weir_bin, hook, table, secret };

        let b = Arc::new(CapacityBackend::start(apps.b.clone()).await?);
        let c = Arc::new(CapacityBackend::start(apps.c.clone()).await?);
        let mut proxies = Vec::new();
        let mut admins = BTreeMap::new();
        let mut authorities = BTreeMap::new();

        for (name, backend, workers) in [("b", &b, apps.b.workers), ("c", &c, apps.c.workers)] {
            let (front, admin) =
                starter.front(name, backend.addr(), workers, distinct_ports()?, None).await?;
            authorities.insert(name, front.addr.to_string());
            admins.extend(admin.map(|a| (name, a)));
            proxies.extend(front.proxy);
        }

        // A: its sidecar's ports are chosen now, so app A knows where its egress will be.
        let a_ports = distinct_ports()?;
        let a_egress = topology.egress().then_some(a_ports[2]);
        let via = |front: &str| -> anyhow::Result<SocketAddr> {
            match a_egress {
                Some(egress) => Ok(egress),
                None => Ok(authorities[front].parse()?),
            }
        };
        let downstream = |name: &'static str| -> anyhow::Result<Downstream> {
            Ok(Downstream { name, via: via(name)?, authority: authorities[name].clone() })
        };
        let app_a = Arc::new(HopApp::new(HopAppConfig {
            name: "a",
            workers: apps.a_workers,
            work: apps.a_work,
            x_calls: (0..k).map(|_| downstream("b")).collect::<anyhow::Result<_>>()?,
            y_calls: vec![downstream("c")?],
        }));
        let (app_a_addr, a_guard) = app_a.clone().serve().await?;
        let (front, admin) =
            starter.front("a", app_a_addr, apps.a_workers, a_ports, a_egress).await?;
        authorities.insert("a", front.addr.to_string());
        admins.extend(admin.map(|a| ("a", a)));
        proxies.extend(front.proxy);

        let e_ports = distinct_ports()?;
        let e_egress = topology.egress().then_some(e_ports[2]);
        let to_a = Downstream {
            name: "a",
            via: e_egress.unwrap_or(front.addr),
            authority: authorities["a"].clone(),
        };
        let app_e = Arc::new(HopApp::new(HopAppConfig {
            name: "e",
            workers: apps.e_workers,
            work: Duration::ZERO,
            x_calls: vec![to_a.clone()],
            y_calls: vec![to_a],
        }));
        let (app_e_addr, e_guard) = app_e.clone().serve().await?;
        let (front, admin) =
            starter.front("e", app_e_addr, apps.e_workers, e_ports, e_egress).await?;
        authorities.insert("e", front.addr.to_string());
        admins.extend(admin.map(|a| ("e", a)));
        proxies.extend(front.proxy);

        Ok(Graph {
            entry: front.addr,
            admins,
            authorities,
            app_e,
            app_a,
            b,
            c,
            _proxies: proxies,
            _guards: vec![a_guard, e_guard],
            _dir: dir,
        })
    }
}

struct Starter<'a> {
    topology: Topology,
    weir_bin: PathBuf,
    hook: Option<&'a MultihopHook>,
    table: PathBuf,
    secret: PathBuf,
}

impl Starter<'_> {
    /// The contender's proxy in front of `app` (hop `name`); with weir, also its admin.
    /// weir listens on `ports[0]`, serves its admin on `ports[1]` and its egress (if any) on
    /// `egress`.
    async fn front(
        &self,
        name: &'static str,
        app: SocketAddr,
        workers: usize,
        ports: [SocketAddr; 3],
        egress: Option<SocketAddr>,
    ) -> anyhow::Result<(Front, Option<SocketAddr>)> {
        match self.topology {
            Topology::Direct => Ok((Front { addr: app, proxy: None }, None)),
            Topology::Haproxy => {
                let options = contender::Options {
                    weir_bin: self.weir_bin.clone(),
                    max_inflight: workers,
                    weir_max_inflight: None,
                    pin_cpu: None,
                    protocol: Protocol::Http1,
                    queue_timeout: Duration::from_millis(500),
                };
                let proxy = Contender::start(Kind::Haproxy, app, &options).await?;
                Ok((Front { addr: proxy.addr, proxy: Some(proxy) }, None))
            }
            Topology::Inbound | Topology::OneHop | Topology::Multihop => {
                let (listen, admin) = (ports[0], ports[1]);
                let entry = (name == "e").then_some((self.table.as_path(), self.secret.as_path()));
                let mut yaml = weir_yaml(listen, app, admin, egress, entry);
                if let (Topology::Multihop, Some(hook)) = (self.topology, self.hook) {
                    yaml = hook.apply(name, &yaml)?;
                }
                if self.topology == Topology::OneHop && egress.is_some() {
                    // One level per sidecar, as weir shipped before per-route levels.
                    let mut config: serde_yaml::Value = serde_yaml::from_str(&yaml)?;
                    merge(&mut config, &serde_yaml::from_str(ONE_HOP_ONLY)?);
                    yaml = serde_yaml::to_string(&config)?;
                }
                let proxy = Contender::weir_with_config(&self.weir_bin, &yaml)
                    .await
                    .map_err(|e| anyhow::anyhow!("weir {name}: {e:#}"))?;
                debug_assert!(self.topology.weir());
                Ok((Front { addr: listen, proxy: Some(proxy) }, Some(admin)))
            }
        }
    }
}

/// Three ports on 127.0.0.1 that were free a moment ago and differ from each other (picked
/// while all three are held: one by one, the kernel may hand the same port out twice).
fn distinct_ports() -> std::io::Result<[SocketAddr; 3]> {
    let held = [0; 3].map(|_| std::net::TcpListener::bind("127.0.0.1:0"));
    let [a, b, c] = held;
    Ok([a?.local_addr()?, b?.local_addr()?, c?.local_addr()?])
}

/// One sidecar's configuration: weir's shipped defaults except what the graph needs (its
/// listeners, the entry's table and secret, the egress role) and one thread per role (four
/// sidecars, the apps and the clients share two cores).
pub fn weir_yaml(
    listen: SocketAddr,
    app: SocketAddr,
    admin: SocketAddr,
    egress: Option<SocketAddr>,
    entry: Option<(&Path, &Path)>,
) -> String {
    let mut yaml = format!("inbound:\n  listen: {listen}\n  app: {app}\n  threads: 1\n");
    if entry.is_some() {
        yaml.push_str("  entry: true\n");
    }
    yaml.push_str(&format!("admin:\n  listen: {admin}\n"));
    if let Some((table, secret)) = entry {
        yaml.push_str(&format!(
            "  table_file: {}\n  user_secret_file: {}\n",
            table.display(),
            secret.display()
        ));
    }
    if let Some(egress) = egress {
        yaml.push_str(&format!("egress:\n  enabled: true\n  listen: {egress}\n  threads: 1\n"));
    }
    yaml.push_str("log:\n  filter: warn\n");
    yaml
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_multihop_overlay_merges_over_each_hop() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("overlay.yaml");
        std::fs::write(
            &file,
            "all:\n  egress:\n    level_expiry: 1s\na:\n  inbound:\n    routes_from: trace\n",
        )
        .unwrap();
        let hook = MultihopHook::load("weir".into(), file.clone()).unwrap();
        let l: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let base = weir_yaml(l, l, l, Some(l), None);
        let a: serde_yaml::Value = serde_yaml::from_str(&hook.apply("a", &base).unwrap()).unwrap();
        assert_eq!(a["egress"]["level_expiry"].as_str(), Some("1s"));
        assert_eq!(a["egress"]["enabled"].as_bool(), Some(true), "kept");
        assert_eq!(a["inbound"]["routes_from"].as_str(), Some("trace"));
        assert_eq!(a["inbound"]["threads"].as_u64(), Some(1), "kept");
        let b: serde_yaml::Value = serde_yaml::from_str(&hook.apply("b", &base).unwrap()).unwrap();
        assert!(b["inbound"].get("routes_from").is_none());
        std::fs::write(&file, "x: {}\n").unwrap();
        let err = MultihopHook::load("weir".into(), file).unwrap_err().to_string();
        assert!(err.contains("unknown key"), "{err}");
    }

    #[test]
    fn the_entry_gets_its_table_and_only_egress_hops_an_egress() {
        let l: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let p = Path::new("/t");
        let e = weir_yaml(l, l, l, Some(l), Some((p, p)));
        assert!(e.contains("entry: true") && e.contains("table_file: /t") && e.contains("egress:"));
        let b = weir_yaml(l, l, l, None, None);
        assert!(!b.contains("entry") && !b.contains("egress"));
    }
}

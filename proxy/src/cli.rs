//! The `weir` command line. `main.rs` only calls [`main`].

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use control_api::cli::{ClientArgs, TableCommand};

use crate::config::{Overrides, SidecarConfig};
use crate::error::StartError;
use crate::sidecar::Sidecar;
use crate::telemetry;

/// BSD `EX_USAGE`: a bad flag or configuration.
pub const EXIT_USAGE: u8 = 64;

#[derive(Debug, Parser)]
#[command(name = "weir", version, about = "DAGOR overload control as a sidecar proxy")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve: the inbound listener in front of the app, and the admin API.
    Run(RunArgs),
    /// Show weir under overload: an app, a sidecar and a 0.5x -> 3x -> 0.5x load, in-process.
    Demo(crate::demo::DemoArgs),
    /// Show a running sidecar's status.
    Status(ClientArgs),
    /// Read, replace or check the priority table of a running sidecar.
    Table {
        #[command(flatten)]
        client: ClientArgs,
        /// Check the file here instead of asking a sidecar (only with `validate`).
        #[arg(long, global = true)]
        offline: bool,
        #[command(subcommand)]
        command: TableCommand,
    },
    /// Show the priority distribution and inflation findings.
    Audit(ClientArgs),
    /// Serve the Kubernetes sidecar-injection webhook (mutating admission, HTTPS).
    Inject(weir_inject::cli::InjectArgs),
    /// Check a configuration file offline.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Parse and validate FILE exactly as `weir run --config FILE` would, without serving:
    /// exit 0, or 64 with one line naming the field. The files the settings name are not
    /// read (they exist only in the pod) unless `--files` is given. `-` reads standard input.
    Check {
        file: PathBuf,
        /// Also check the files the settings name, as `weir run` does before it starts
        /// (token, user secret, table readable; state path writable): for use in the pod.
        #[arg(long)]
        files: bool,
    },
    /// Print the embedded default configuration (what `weir run` serves with no
    /// `--config`): every field, with its default.
    PrintDefault,
    /// Print the JSON Schema of the configuration file, generated from weir's config types.
    Schema {
        /// The chart's `config` value instead (charts/weir/values.schema.json): without the
        /// file paths the chart fills in, with the listeners its templates read required.
        #[arg(long)]
        chart: bool,
    },
}

#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// YAML configuration (`-`: standard input); without it the embedded default serves.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Inbound listener address (default 127.0.0.1:15101).
    #[arg(long, value_name = "ADDR")]
    pub inbound: Option<SocketAddr>,
    /// The app's address (default 127.0.0.1:8080).
    #[arg(long, value_name = "ADDR")]
    pub app: Option<SocketAddr>,
    /// Admin API address (default 127.0.0.1:15100).
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<SocketAddr>,
    /// Public listener address, serving only /metrics, /live and /ready (for probes and
    /// Prometheus; off unless configured): `admin.public_listen`.
    #[arg(long, value_name = "ADDR")]
    pub public: Option<SocketAddr>,
    /// Egress listener address: enables the egress role (default 127.0.0.1:15102 when
    /// enabled in the config).
    #[arg(long, value_name = "ADDR")]
    pub egress: Option<SocketAddr>,
    /// Requests forwarded to the app at once.
    #[arg(long, value_name = "N")]
    pub max_inflight: Option<usize>,
    /// Entry role: stamp priorities from the priority table, ignoring the client's.
    #[arg(long)]
    pub entry: bool,
    /// Priority table file (watched and hot-reloaded).
    #[arg(long, value_name = "FILE")]
    pub table: Option<PathBuf>,
    /// On SIGTERM, keep serving this long (with /ready failing) before draining:
    /// `inbound.drain_delay` (for regular sidecars on Kubernetes < 1.30).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub drain_delay: Option<std::time::Duration>,
    /// Once every listener is bound and `/ready` answers 200, write their addresses here as
    /// JSON ([`ReadyFile`]), atomically (a temporary file renamed into place). With port 0
    /// in the listen addresses, this is how a supervisor or a test learns the ports weir
    /// bound, without picking free ports itself.
    #[arg(long, value_name = "FILE")]
    pub ready_file: Option<PathBuf>,
}

/// What `weir run --ready-file FILE` writes: the address each listener is bound to.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReadyFile {
    pub pid: u32,
    pub inbound: SocketAddr,
    pub admin: SocketAddr,
    /// `admin.public_listen`, when configured.
    pub public: Option<SocketAddr>,
    /// The egress listener, when the egress role is on.
    pub egress: Option<SocketAddr>,
    /// The egress's fixed routes, in `egress.routes` order.
    pub egress_routes: Vec<SocketAddr>,
}

impl ReadyFile {
    /// The bound addresses of a started sidecar.
    pub fn of(sidecar: &Sidecar) -> ReadyFile {
        let egress = sidecar.egress();
        ReadyFile {
            pid: std::process::id(),
            inbound: sidecar.inbound_addr(),
            admin: sidecar.admin_addr(),
            public: sidecar.public_addr(),
            egress: egress.map(|e| e.addr()),
            egress_routes: egress.map(|e| e.route_addrs().to_vec()).unwrap_or_default(),
        }
    }

    /// Writes the JSON to `path` atomically: readers see no file or the whole of it.
    pub fn write(&self, path: &std::path::Path) -> std::io::Result<()> {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".{}.tmp", self.pid));
        let tmp = PathBuf::from(tmp);
        let json = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, json)?;
        std::fs::rename(&tmp, path).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    }
}

fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(s).map_err(|e| e.to_string())
}

/// Parses `args` and runs the command.
pub fn main(args: impl IntoIterator<Item = impl Into<OsString> + Clone>) -> ExitCode {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind::*;
            if matches!(
                e.kind(),
                DisplayHelp | DisplayVersion | DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                return if e.kind() == DisplayHelpOnMissingArgumentOrSubcommand {
                    ExitCode::from(EXIT_USAGE)
                } else {
                    ExitCode::SUCCESS
                };
            }
            let rendered = e.to_string();
            let mut line = rendered.lines().next().unwrap_or("invalid arguments").to_string();
            if e.kind() == MissingRequiredArgument {
                // clap lists the missing flags on the following lines: keep them on this one.
                let missing: Vec<&str> = rendered
                    .lines()
                    .skip(1)
                    .map(str::trim)
                    .take_while(|l| l.starts_with("--") || l.starts_with('<'))
                    .collect();
                line = format!("{} {}", line.trim_end_matches(':'), missing.join(", "));
            }
            eprintln!("weir: {}", line.trim_start_matches("error: "));
            return ExitCode::from(EXIT_USAGE);
        }
    };
    match cli.command {
        Command::Run(args) => run(args),
        Command::Demo(args) => crate::demo::run(args),
        Command::Status(client) => control_api::cli::status(&client),
        Command::Table { offline: true, command: TableCommand::Validate { file }, .. } => {
            table_validate_offline(&file)
        }
        Command::Table { offline: true, .. } => {
            eprintln!("weir: --offline: only `weir table validate --offline FILE` works without a sidecar");
            ExitCode::from(EXIT_USAGE)
        }
        Command::Table { client, command, .. } => control_api::cli::table(&client, command),
        Command::Audit(client) => control_api::cli::audit(&client),
        Command::Inject(args) => {
            telemetry::init_logging(&crate::config::LogConfig::default());
            weir_inject::cli::run(args)
        }
        Command::Config { command: ConfigCommand::Check { file, files } } => {
            config_check(&file, files)
        }
        Command::Config { command: ConfigCommand::PrintDefault } => {
            print!("{}", crate::config::EMBEDDED_DEFAULT);
            ExitCode::SUCCESS
        }
        Command::Config { command: ConfigCommand::Schema { chart } } => {
            let schema = if chart {
                crate::config::schema::chart_config_schema()
            } else {
                let mut s = crate::config::schema::json_schema();
                s["$schema"] = "http://json-schema.org/draft-07/schema#".into();
                s
            };
            println!("{}", serde_json::to_string_pretty(&schema).unwrap_or_default());
            ExitCode::SUCCESS
        }
    }
}

/// `weir config check FILE [--files]`: the same load and validation as
/// `weir run --config FILE` (and its file preflight with `--files`).
pub fn config_check(file: &std::path::Path, files: bool) -> ExitCode {
    let checked = SidecarConfig::load(Some(file)).and_then(|config| {
        if files {
            config.preflight().map(|()| config)
        } else {
            Ok(config)
        }
    });
    match checked {
        Ok(_) => {
            println!("{}: ok", control_api::input::display(file));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("weir: {e}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// `weir table validate --offline FILE`: the same parse and compile as `weir run` applies to
/// its table file, without a sidecar.
pub fn table_validate_offline(file: &std::path::Path) -> ExitCode {
    let checked = control_api::read_table_arg(file)
        .map_err(|e| e.to_string())
        .and_then(|(table, _)| table.compile().map_err(|e| e.to_string()));
    match checked {
        Ok(compiled) => {
            println!("{}: ok (version {})", control_api::input::display(file), compiled.version());
            ExitCode::SUCCESS
        }
        Err(e) => {
            let line = e.lines().next().unwrap_or("invalid table").to_string();
            eprintln!("weir: {line}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// `weir run`.
pub fn run(args: RunArgs) -> ExitCode {
    let config = match resolve(&args) {
        Ok(config) => config,
        Err(line) => {
            eprintln!("weir: {line}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    telemetry::init_logging(&config.log);
    let sidecar = match Sidecar::start_with(config, true) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("weir: {e}");
            return match e {
                StartError::Config(_) => ExitCode::from(EXIT_USAGE),
                _ => ExitCode::FAILURE,
            };
        }
    };
    if let Some(path) = &args.ready_file {
        if let Err(e) = ReadyFile::of(&sidecar).write(path) {
            // Whoever waits for the file would wait in vain: stop rather than serve unseen.
            eprintln!("weir: --ready-file {}: {e}", path.display());
            drop(sidecar);
            return ExitCode::FAILURE;
        }
    }
    let drained = sidecar.run_until_signal();
    if !drained {
        tracing::warn!("shutdown grace ended with requests still running");
    }
    ExitCode::SUCCESS
}

/// The configuration `weir run` would serve with: file (or embedded) plus flags.
pub fn resolve(args: &RunArgs) -> Result<SidecarConfig, String> {
    let mut config = SidecarConfig::load(args.config.as_deref()).map_err(|e| e.to_string())?;
    let overrides = Overrides {
        inbound: args.inbound,
        app: args.app,
        admin: args.admin,
        public: args.public,
        max_inflight: args.max_inflight,
        entry: args.entry,
        table: args.table.clone(),
        egress: args.egress,
        drain_delay: args.drain_delay,
    };
    config.apply(&overrides).map_err(|e| e.to_string())?;
    // The files the settings name, checked before anything starts or logs.
    config.preflight().map_err(|e| e.to_string())?;
    Ok(config)
}

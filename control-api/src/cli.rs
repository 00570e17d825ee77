//! The `weir status | table get|put|validate | audit` clients of the admin API.
//!
//! Blocking: each call runs one request on a current-thread runtime, so the `weir`
//! binary can call these from plain `main` code. Human-readable output by default, the
//! API's JSON with `--json`. Exit codes follow sysexits: 65 invalid input, 66 missing
//! file, 69 API unreachable, 75 conflict (retry), 77 refused credentials, 1 otherwise.

mod http;
mod render;

use self::http::{expect_ok, json, send};

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use ::http::Method;

use crate::source::parse_table;
use crate::status::StatusDoc;

#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// Address of the sidecar's admin API.
    #[arg(
        long,
        global = true,
        value_name = "ADDR",
        default_value = "127.0.0.1:15100",
        env = "WEIR_ADMIN"
    )]
    pub admin: String,
    /// File holding the bearer token for changes (the Kubernetes Secret's file).
    #[arg(long, global = true, value_name = "FILE", env = "WEIR_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Print the API's JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum TableCommand {
    /// Print the table in use (YAML; JSON with --json).
    Get,
    /// Replace the table with FILE (YAML or JSON; `-` reads standard input). Guards against
    /// lost updates with the
    /// `version` inside FILE (as printed by `get`), or --if-match.
    Put {
        file: PathBuf,
        /// The version your edit is based on; overrides the `version` in FILE.
        #[arg(long, value_name = "VERSION")]
        if_match: Option<u64>,
    },
    /// Check FILE (`-`: standard input) against the sidecar without changing anything.
    Validate { file: PathBuf },
}

/// A failed CLI call: what to print and the exit code.
#[derive(Debug)]
pub struct CliError {
    pub message: String,
    pub code: u8,
}

pub fn status(args: &ClientArgs) -> ExitCode {
    finish(status_text(args))
}

pub fn audit(args: &ClientArgs) -> ExitCode {
    finish(audit_text(args))
}

pub fn table(args: &ClientArgs, command: TableCommand) -> ExitCode {
    finish(table_text(args, &command))
}

/// What `weir status` prints.
pub fn status_text(args: &ClientArgs) -> Result<String, CliError> {
    let reply = expect_ok(send(args, Method::GET, "/v1/status", &[], None)?)?;
    if args.json {
        return Ok(reply.body);
    }
    // The typed document the server writes: one definition of /v1/status.
    render::status(&json::<StatusDoc>(&reply.body)?)
}

/// What `weir audit` prints.
pub fn audit_text(args: &ClientArgs) -> Result<String, CliError> {
    let reply = expect_ok(send(args, Method::GET, "/v1/audit", &[], None)?)?;
    if args.json {
        return Ok(reply.body);
    }
    render::audit(&json::<serde_json::Value>(&reply.body)?)
}

/// What `weir table ...` prints.
pub fn table_text(args: &ClientArgs, command: &TableCommand) -> Result<String, CliError> {
    match command {
        TableCommand::Get => {
            let accept = if args.json { "application/json" } else { "application/yaml" };
            let reply = send(args, Method::GET, "/v1/priority-table", &[("accept", accept)], None)?;
            Ok(expect_ok(reply)?.body)
        }
        TableCommand::Put { file, if_match } => put(args, file, *if_match),
        TableCommand::Validate { file } => {
            let (text, content_type) = read_file(file)?;
            let headers = [("content-type", content_type)];
            let reply =
                send(args, Method::POST, "/v1/priority-table/validate", &headers, Some(text))?;
            let reply = expect_ok(reply)?;
            if args.json {
                return Ok(reply.body);
            }
            let v: serde_json::Value = json(&reply.body)?;
            Ok(format!(
                "{}: valid ({} rules; least important business class {})\n",
                file.display(),
                v["rules"],
                v["least_important_business"]
            ))
        }
    }
}

fn put(args: &ClientArgs, file: &Path, if_match: Option<u64>) -> Result<String, CliError> {
    let (text, content_type) = read_file(file)?;
    // Check locally first: same validation, no round trip, and it yields the version.
    let local = parse_table(&text).map_err(|e| CliError {
        message: render::field_errors(
            &format!("{}: invalid priority table", file.display()),
            e.iter().map(|e| (e.path.as_str(), e.message.as_str())),
        ),
        code: 65,
    })?;
    let version = match if_match.or((local.version > 0).then_some(local.version)) {
        Some(v) => v,
        None => {
            return Err(CliError {
                message: format!(
                    "{} has no `version`: start from `weir table get > FILE`, or pass --if-match VERSION",
                    file.display()
                ),
                code: 65,
            })
        }
    };
    let token = match &args.token_file {
        Some(path) => std::fs::read_to_string(path)
            .map(|t| t.trim().to_owned())
            .map_err(|e| CliError { message: format!("{}: {e}", path.display()), code: 66 })?,
        None => String::new(),
    };
    let auth = format!("Bearer {token}");
    let tag = format!("\"{version}\"");
    let mut headers = vec![("content-type", content_type), ("if-match", tag.as_str())];
    if !token.is_empty() {
        headers.push(("authorization", auth.as_str()));
    }
    let reply = expect_ok(send(args, Method::PUT, "/v1/priority-table", &headers, Some(text))?)?;
    if args.json {
        return Ok(reply.body);
    }
    let v: serde_json::Value = json(&reply.body)?;
    Ok(format!("accepted: the table is now version {} ({} rules)\n", v["version"], v["rules"]))
}

fn read_file(file: &Path) -> Result<(String, &'static str), CliError> {
    let text = crate::input::read_to_string(file).map_err(|e| CliError {
        message: format!("{}: {e}", crate::input::display(file)),
        code: 66,
    })?;
    let is_json = file.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"))
        || text.trim_start().starts_with('{');
    Ok((text, if is_json { "application/json" } else { "application/yaml" }))
}

fn finish(result: Result<String, CliError>) -> ExitCode {
    match result {
        Ok(text) => {
            print!("{text}");
            if !text.ends_with('\n') {
                println!();
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("weir: {}", e.message);
            ExitCode::from(e.code)
        }
    }
}

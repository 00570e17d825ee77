//! What the benchmark runners' command lines share: app and mix arguments, where the
//! `weir` binary is, how busy the machine was.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::backend::BackendConfig;

/// `WORKERSxMS` (`4x10`): a capacity-model app of that many workers, each request taking
/// that many milliseconds.
pub fn parse_app(text: &str) -> anyhow::Result<BackendConfig> {
    let (workers, ms) = text
        .split_once('x')
        .ok_or_else(|| anyhow::anyhow!("app `{text}`: expected WORKERSxMS, e.g. 4x10"))?;
    Ok(BackendConfig::new(
        workers.trim().parse()?,
        Duration::from_secs_f64(ms.trim().parse::<f64>()? / 1000.0),
    ))
}

/// `C/N/B` percentages (`10/30/60`) of the critical, normal and background classes,
/// normalised to shares.
pub fn parse_mix(text: &str) -> anyhow::Result<[f64; 3]> {
    let parts: Vec<f64> =
        text.split('/').map(|p| p.trim().parse::<f64>()).collect::<Result<_, _>>()?;
    let [c, n, b] = parts[..] else { anyhow::bail!("mix `{text}`: expected C/N/B, e.g. 10/30/60") };
    let total = c + n + b;
    anyhow::ensure!(total > 0.0, "mix `{text}` is empty");
    Ok([c / total, n / total, b / total])
}

/// The `weir` binary built next to the running program (same profile), else the
/// workspace's release build.
pub fn default_weir_bin(workspace: &Path) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("weir")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| workspace.join("target/release/weir"))
}

/// The first three fields of /proc/loadavg (the machine is shared: say how busy it was).
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// The options every runner takes.
#[derive(clap::Args, Debug, Clone)]
pub struct RunnerArgs {
    /// Seed of the load's arrivals, users and classes (the same for every contender).
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// The `weir` binary [default: target/release/weir next to this program].
    #[arg(long)]
    pub weir_bin: Option<PathBuf>,
    /// Where JSON, markdown and SVGs go [default: the runner's folder in tests/bench/out].
    #[arg(long)]
    pub out: Option<PathBuf>,
}

impl RunnerArgs {
    /// `--weir-bin`, else [`default_weir_bin`]; an error that says how to build it when it
    /// is missing.
    pub fn weir_bin(&self, workspace: &Path) -> anyhow::Result<PathBuf> {
        let bin = self.weir_bin.clone().unwrap_or_else(|| default_weir_bin(workspace));
        anyhow::ensure!(
            bin.is_file(),
            "{} not found (build it: `cargo build --release -p proxy --bin weir`, or pass --weir-bin)",
            bin.display()
        );
        Ok(bin)
    }

    /// `--out`, else `default` (created either way).
    pub fn out_dir(&self, default: PathBuf) -> anyhow::Result<PathBuf> {
        let out = self.out.clone().unwrap_or(default);
        std::fs::create_dir_all(&out)?;
        Ok(out)
    }
}

/// The line a report ends with: how long the run took and the command that ran it.
pub fn run_footer(started: std::time::Instant) -> String {
    format!(
        "Run took {:.0} s: `{}`\n",
        started.elapsed().as_secs_f64(),
        std::env::args().collect::<Vec<_>>().join(" ")
    )
}

/// One benchmark run, for its report: when it started and how busy the machine was then.
pub struct BenchRun {
    started: std::time::Instant,
    loadavg_before: String,
}

impl BenchRun {
    pub fn start() -> BenchRun {
        BenchRun { started: std::time::Instant::now(), loadavg_before: loadavg() }
    }

    pub fn loadavg_before(&self) -> &str {
        &self.loadavg_before
    }

    /// Writes `<name>.json` and `<name>.md` into `out` and returns the markdown: the
    /// machine, the load average before and after, `body` and [`run_footer`]; the JSON holds
    /// the machine and `result`.
    pub fn report(
        &self,
        out: &Path,
        name: &str,
        result: &impl serde::Serialize,
        body: &str,
    ) -> anyhow::Result<String> {
        let machine = crate::report::Machine::probe();
        let markdown = format!(
            "{}- load average before / after: {} / {}\n\n{}\n{}",
            machine.markdown(),
            self.loadavg_before,
            loadavg(),
            body,
            run_footer(self.started)
        );
        let json = serde_json::json!({ "machine": machine, "result": result });
        write_report(out, name, &json, &markdown)?;
        Ok(markdown)
    }
}

/// Writes `<name>.json` and `<name>.md` into `out`.
pub fn write_report(
    out: &Path,
    name: &str,
    json: &serde_json::Value,
    markdown: &str,
) -> anyhow::Result<()> {
    std::fs::write(out.join(format!("{name}.json")), serde_json::to_vec_pretty(json)?)?;
    std::fs::write(out.join(format!("{name}.md")), markdown)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apps_and_mixes_parse_or_say_what_is_expected() {
        let app = parse_app("4x12.5").unwrap();
        assert_eq!((app.workers, app.service_time), (4, Duration::from_micros(12_500)));
        assert!(parse_app("4-10").unwrap_err().to_string().contains("WORKERSxMS"));
        assert_eq!(parse_mix("1/1/2").unwrap(), [0.25, 0.25, 0.5]);
        assert!(parse_mix("1/2").is_err());
        assert!(parse_mix("0/0/0").is_err());
    }
}

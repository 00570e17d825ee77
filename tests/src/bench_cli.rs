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

//! Crash-safe persistence of accepted tables.
//!
//! The state file is rewritten whole: write a temp file in the same directory, fsync it,
//! rename it over the state file, fsync the directory. A crash at any point leaves either
//! the old or the new file under the state path, never a torn one.
//!
//! The first line records which content of the watched table file (ConfigMap) the state
//! already reflects, as a YAML comment, so the file stays a plain, valid table. At start
//! the state wins unless the table file changed since (see `source.rs`).

use std::fs::{self, File, OpenOptions};
use std::hash::Hasher;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use admission_core::table::PriorityTable;
use siphasher::sip::SipHasher24;

use admission_core::FieldError;

use crate::error::ControlError;

const DIGEST_PREFIX: &str = "# weir-table-file-digest: ";

/// A table as persisted, with the digest of the table file it has seen.
#[derive(Debug, Clone, PartialEq)]
pub struct Persisted {
    pub table: PriorityTable,
    pub table_file_digest: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct StateFile {
    path: PathBuf,
    temp: PathBuf,
}

/// Stable content digest (SipHash-2-4, fixed key): the same across processes and builds.
pub fn digest(content: &[u8]) -> u64 {
    let mut h = SipHasher24::new_with_keys(0, 0);
    h.write(content);
    h.finish()
}

// === impl StateFile ===

impl StateFile {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        let mut temp = path.clone().into_os_string();
        temp.push(".tmp");
        StateFile { path, temp: temp.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Atomically replaces the state file. Callers serialise writes (the store's commit
    /// lock), so one fixed temp name suffices and crashed attempts leave no litter.
    pub fn write(&self, table: &PriorityTable, table_file_digest: Option<u64>) -> io::Result<()> {
        let mut text = String::new();
        if let Some(d) = table_file_digest {
            text.push_str(&format!("{DIGEST_PREFIX}{d:016x}\n"));
        }
        text.push_str(&table.to_yaml());
        let mut file =
            OpenOptions::new().write(true).create(true).truncate(true).open(&self.temp)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        drop(file);
        fs::rename(&self.temp, &self.path)?;
        // Make the rename itself durable.
        let dir = match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        File::open(dir)?.sync_all()
    }

    /// `Ok(None)` when no state was persisted yet.
    pub fn read(&self) -> Result<Option<Persisted>, ControlError> {
        let text = match fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(ControlError::Io { path: self.path.clone(), source }),
        };
        let table = PriorityTable::from_yaml(&text).map_err(|e| {
            ControlError::Config(FieldError::new(
                "admin.state_path",
                format!("state file {}: {e}", self.path.display()),
            ))
        })?;
        let table_file_digest = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix(DIGEST_PREFIX))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok());
        Ok(Some(Persisted { table, table_file_digest }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_with_and_without_digest() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateFile::new(dir.path().join("table.yaml"));
        assert_eq!(state.read().unwrap(), None);
        let mut table = PriorityTable::embedded_default();
        table.version = 9;
        state.write(&table, Some(0xabc)).unwrap();
        let got = state.read().unwrap().unwrap();
        assert_eq!(got, Persisted { table: table.clone(), table_file_digest: Some(0xabc) });
        state.write(&table, None).unwrap();
        assert_eq!(state.read().unwrap().unwrap().table_file_digest, None);
        assert!(!dir.path().join("table.yaml.tmp").exists());
    }

    #[test]
    fn a_torn_state_file_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("table.yaml");
        fs::write(&path, "rules:\n  - name: x\n    match: { pa").unwrap();
        let err = StateFile::new(&path).read().unwrap_err();
        assert!(err.to_string().contains("state file"), "{err}");
    }

    #[test]
    fn digest_is_stable() {
        // Pinned: a state file written by one build must be read the same by the next.
        assert_eq!(digest(b"version: 1\n"), 12632948280246242691);
        assert_ne!(digest(b"version: 1\n"), digest(b"version: 2\n"));
    }
}

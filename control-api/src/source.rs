//! Where the table comes from: the start-up precedence and the table-file watcher.
//!
//! Rule: **the newest accepted change wins.**
//! - At start: the state file (the last accepted table) if present and valid, unless the
//!   table file's content differs from the one the state recorded (the ConfigMap was edited
//!   while the process was down; then the table file wins); without a state file, the table
//!   file; else the embedded default. (`weir run --table FILE` sets the table file.) An
//!   invalid state or table file is logged and skipped; an invalid table file with nothing
//!   better to serve is a start-up error.
//! - At run time: API edits and table-file changes apply in the order they happen; a
//!   change of the table file's content replaces earlier API edits (logged).

use std::io::Read as _;
use std::path::Path;

use admission_core::table::{CompiledTable, PriorityTable, TableErrors, MAX_DOCUMENT_BYTES};
use admission_core::FieldError;

use crate::config::AdminConfig;
use crate::error::ControlError;
use crate::persist::{digest, StateFile};

/// Parses a table document, JSON if it starts with `{`, else YAML.
pub fn parse_table(text: &str) -> Result<PriorityTable, TableErrors> {
    if text.trim_start().starts_with('{') {
        PriorityTable::from_json(text)
    } else {
        PriorityTable::from_yaml(text)
    }
}

/// Reads and parses a table file; also returns the digest of its content. Errors say
/// which file and what is wrong with it; the caller names the setting.
pub fn read_table_file(path: &Path) -> Result<(PriorityTable, u64), ControlError> {
    let bytes =
        read_table_bytes(path).map_err(|source| ControlError::Io { path: path.into(), source })?;
    parse_table_bytes(path, &bytes)
}

/// As [`read_table_file`], for a command-line argument: `-` reads standard input.
pub fn read_table_arg(path: &Path) -> Result<(PriorityTable, u64), ControlError> {
    let bytes = crate::input::read(path)
        .map_err(|source| ControlError::Io { path: path.into(), source })?;
    parse_table_bytes(path, &bytes)
}

fn parse_table_bytes(path: &Path, bytes: &[u8]) -> Result<(PriorityTable, u64), ControlError> {
    let text = String::from_utf8_lossy(bytes);
    let table = parse_table(&text).map_err(|e| {
        ControlError::Config(FieldError::new("", format!("{}: {e}", crate::input::display(path))))
    })?;
    Ok((table, digest(bytes)))
}

/// A table file's content, read with bounds whatever the path leads to: stat first
/// (through symlinks: a mounted ConfigMap is one), regular files only (a link to
/// `/dev/zero`, a FIFO or a directory is refused without reading a byte), and at most
/// [`MAX_DOCUMENT_BYTES`] + 1 bytes read (the table parser refuses more; a file that grew
/// after the stat is caught by the extra byte).
pub fn read_table_bytes(path: &Path) -> std::io::Result<Vec<u8>> {
    read_bounded(path, MAX_DOCUMENT_BYTES)
}

fn read_bounded(path: &Path, max: usize) -> std::io::Result<Vec<u8>> {
    use std::io::{Error, ErrorKind};
    let regular = |meta: &std::fs::Metadata| {
        if meta.is_file() {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::InvalidInput,
                format!("not a regular file but {}", file_kind(meta.file_type())),
            ))
        }
    };
    let too_large = |len: u64| {
        Err(Error::new(
            ErrorKind::InvalidData,
            format!("{len} bytes or more; a table document has at most {max}"),
        ))
    };
    let stat = std::fs::metadata(path)?;
    regular(&stat)?;
    if stat.len() > max as u64 {
        return too_large(stat.len());
    }
    let file = std::fs::File::open(path)?;
    // The path may have been swapped since the stat: judge what was opened.
    let opened = file.metadata()?;
    regular(&opened)?;
    let mut bytes = Vec::with_capacity(opened.len().min(max as u64) as usize);
    file.take(max as u64 + 1).read_to_end(&mut bytes)?;
    if bytes.len() > max {
        return too_large(bytes.len() as u64);
    }
    Ok(bytes)
}

fn file_kind(t: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_dir() {
        "a directory"
    } else {
        "not a file"
    }
}

/// The message of a start-up error under `field`, without a nested field name.
fn at(field: &str) -> impl Fn(ControlError) -> FieldError + '_ {
    move |e| match e {
        ControlError::Config(inner) if inner.path.is_empty() => {
            FieldError::new(field, inner.message)
        }
        other => FieldError::new(field, other.to_string()),
    }
}

/// The table to serve at start, by the precedence in the module docs. Persists it to the
/// state path when it came from elsewhere. Errors name the setting at fault
/// (`admin.table_file`, `admin.state_path`).
pub fn load_initial_table(cfg: &AdminConfig, secret: &[u8]) -> Result<CompiledTable, FieldError> {
    let state = cfg.state_path.as_ref().map(StateFile::new);
    let persisted = state.as_ref().and_then(|s| match s.read() {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "ignoring unreadable state file");
            None
        }
    });
    let file = cfg.table_file.as_deref().map(read_table_file);
    let (mut table, origin, file_digest) = match (persisted, file) {
        (Some(p), Some(Ok((t, d)))) if p.table_file_digest != Some(d) => {
            tracing::info!("table file changed since the state was saved; it wins");
            let version = t.version.max(p.table.version + 1);
            (PriorityTable { version, ..t }, "table_file", Some(d))
        }
        (Some(p), Some(Err(e))) => {
            tracing::warn!(error = %e, "ignoring invalid table file; serving the saved state");
            (p.table, "state_path", p.table_file_digest)
        }
        (Some(p), _) => (p.table, "state_path", p.table_file_digest),
        (None, Some(Ok((t, d)))) => (t, "table_file", Some(d)),
        (None, Some(Err(e))) => return Err(at("admin.table_file")(e)),
        (None, None) => (PriorityTable::embedded_default(), "embedded default", None),
    };
    table.version = table.version.max(1);
    let field = match origin {
        "table_file" => "admin.table_file",
        "state_path" => "admin.state_path",
        other => other,
    };
    let compiled = table
        .compile_with_secret(secret)
        .map_err(|e| FieldError::new(field, format!("priority table: {e}")))?;
    if let Some(state) = state.filter(|_| origin != "state_path") {
        state.write(compiled.source(), file_digest).map_err(|e| {
            FieldError::new(
                "admin.state_path",
                format!("cannot write {}: {e}", state.path().display()),
            )
        })?;
    }
    tracing::info!(origin, version = compiled.version(), "priority table loaded");
    Ok(compiled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_within_the_bound_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("small.yaml");
        std::fs::write(&small, "rules: []\n").unwrap();
        assert_eq!(read_bounded(&small, 64).unwrap(), b"rules: []\n");
        let exact = dir.path().join("exact");
        std::fs::write(&exact, [b'#'; 64]).unwrap();
        assert_eq!(read_bounded(&exact, 64).unwrap().len(), 64);
        let big = dir.path().join("big");
        std::fs::write(&big, [b'#'; 65]).unwrap();
        let e = read_bounded(&big, 64).unwrap_err();
        assert!(e.to_string().contains("at most 64"), "{e}");
        let e = read_bounded(dir.path(), 64).unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");
        assert!(read_bounded(&dir.path().join("missing"), 64).is_err());
        #[cfg(unix)]
        {
            let zero = dir.path().join("zero");
            std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
            let e = read_bounded(&zero, 64).unwrap_err();
            assert!(e.to_string().contains("a character device"), "{e}");
            // A ConfigMap-style link to a regular file is followed.
            let link = dir.path().join("link");
            std::os::unix::fs::symlink(&small, &link).unwrap();
            assert_eq!(read_bounded(&link, 64).unwrap(), b"rules: []\n");
        }
    }
}

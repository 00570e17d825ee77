//! File arguments of the command line (`weir config check FILE`, `weir table validate FILE`,
//! `weir table put FILE`, `weir run --config FILE`): `-` reads standard input, so a file
//! can come from a pipe (`weir config print-default | weir config check -`,
//! `kubectl get cm ... | weir table validate --offline -`).

use std::io::Read as _;
use std::path::Path;

/// The largest document read from standard input; a config or a table is a few KiB.
pub const MAX_STDIN_BYTES: u64 = 16 << 20;

/// Whether `path` is `-` (standard input).
pub fn is_stdin(path: &Path) -> bool {
    path.as_os_str() == "-"
}

/// How to name `path` in messages: `<stdin>` for `-`.
pub fn display(path: &Path) -> String {
    if is_stdin(path) {
        "<stdin>".into()
    } else {
        path.display().to_string()
    }
}

/// The bytes of the file at `path`, or of standard input for `-` (at most
/// [`MAX_STDIN_BYTES`]). The error says which.
pub fn read(path: &Path) -> std::io::Result<Vec<u8>> {
    if !is_stdin(path) {
        return std::fs::read(path);
    }
    let mut bytes = Vec::new();
    std::io::stdin().lock().take(MAX_STDIN_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_STDIN_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("standard input exceeds {MAX_STDIN_BYTES} bytes"),
        ));
    }
    Ok(bytes)
}

/// As [`read`], as UTF-8 text.
pub fn read_to_string(path: &Path) -> std::io::Result<String> {
    String::from_utf8(read(path)?)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))
}

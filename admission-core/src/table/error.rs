//! Field errors: every problem names the field it is about.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One problem with a document, at a field path such as `rules[2].match.path_prefix` or
/// `inbound.headers.level` (empty for the whole document). The one error type for
/// configuration and table problems across the crates: the priority table, the admin
/// settings and the sidecar configuration all report with it, so `weir run` prints
/// `path: message` and the control API answers `{"path", "message"}` without re-parsing
/// strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

/// The table's name for [`FieldError`].
pub type TableError = FieldError;

/// Every problem found, in document order.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(transparent)]
pub struct TableErrors(pub Vec<TableError>);

// === impl FieldError ===

impl FieldError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError { path: path.into(), message: message.into() }
    }

    /// The same problem, one level down: `at("admin")` turns `token_file` into
    /// `admin.token_file`.
    pub fn at(mut self, parent: &str) -> Self {
        self.path = match (parent.is_empty(), self.path.is_empty()) {
            (true, _) => self.path,
            (false, true) => parent.to_owned(),
            (false, false) => format!("{parent}.{}", self.path),
        };
        self
    }
}

impl std::error::Error for FieldError {}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Deserialises a YAML document into `T`; a failure names the field path it is at
/// (`inbound.listen`), never a string to split. Used by the table and by the sidecar
/// configuration alike.
pub fn from_yaml_str<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, FieldError> {
    let de = serde_yaml::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| from_path_error("YAML", e))
}

/// A `serde_path_to_error` failure as a [`FieldError`] whose message starts `malformed
/// <format>:`.
pub(super) fn from_path_error<E: fmt::Display>(
    format: &str,
    e: serde_path_to_error::Error<E>,
) -> FieldError {
    let path = e.path().to_string();
    // `serde_path_to_error` prints the root as "."; an empty path reads better.
    let path = if path == "." { String::new() } else { path };
    let message = e.inner().to_string();
    // serde_yaml prefixes its own copy of the path; say it once.
    let message = match message.split_once(": ") {
        Some((head, rest)) if !path.is_empty() && path.starts_with(head) => rest.to_owned(),
        _ => message,
    };
    FieldError::new(path, format!("malformed {format}: {message}"))
}

// === impl TableErrors ===

impl TableErrors {
    pub fn one(path: impl Into<String>, message: impl Into<String>) -> Self {
        TableErrors(vec![TableError::new(path, message)])
    }

    pub fn iter(&self) -> impl Iterator<Item = &TableError> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for TableErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.as_slice() {
            [] => f.write_str("invalid priority table"),
            [one] => write!(f, "invalid priority table: {one}"),
            many => {
                write!(f, "invalid priority table ({} errors)", many.len())?;
                many.iter().try_for_each(|e| write!(f, "; {e}"))
            }
        }
    }
}

impl std::error::Error for TableErrors {}

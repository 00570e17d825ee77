//! Table errors: every problem names the field it is about.

use std::fmt;

use serde::Serialize;

/// One problem with a table, at a field path such as `rules[2].match.path_prefix`
/// (empty for the whole document).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TableError {
    pub path: String,
    pub message: String,
}

/// Every problem found, in document order.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(transparent)]
pub struct TableErrors(pub Vec<TableError>);

// === impl TableError ===

impl TableError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        TableError { path: path.into(), message: message.into() }
    }
}

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
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

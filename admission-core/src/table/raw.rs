//! The document as parsed, before range checks.
//!
//! Numbers are read as `i64` and durations as text so that out-of-range values become
//! field errors collected together with every other problem, instead of serde stopping at
//! the first one.

use std::time::Duration;

use serde::Deserialize;

use super::{
    PriorityTable, Rule, RuleMatch, TableError, TableErrors, UserConfig, DEFAULT_BUSINESS,
    DEFAULT_USER_HEADER,
};
use crate::size_grade::SizeGradeConfig;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTable {
    #[serde(default)]
    version: u64,
    #[serde(default = "default_business")]
    default_business: i64,
    #[serde(default)]
    rules: Vec<RawRule>,
    #[serde(default)]
    user: RawUser,
    #[serde(default)]
    size_grade: Option<SizeGradeConfig>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    #[serde(default)]
    name: String,
    #[serde(rename = "match", default)]
    matches: Option<RuleMatch>,
    business: i64,
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawUser {
    header: String,
    rekey_every: String,
}

fn default_business() -> i64 {
    DEFAULT_BUSINESS.into()
}

// === impl RawTable ===

impl RawTable {
    pub(super) fn from_yaml(text: &str) -> Result<Self, TableErrors> {
        let de = serde_yaml::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| parse_error("YAML", e))
    }

    pub(super) fn from_json(text: &str) -> Result<Self, TableErrors> {
        let mut de = serde_json::Deserializer::from_str(text);
        let raw = serde_path_to_error::deserialize(&mut de).map_err(|e| parse_error("JSON", e))?;
        de.end().map_err(|e| TableErrors::one("", format!("malformed JSON: {e}")))?;
        Ok(raw)
    }

    /// Range-checks every number and duration, then runs the semantic validation too, so
    /// a document with both kinds of problems reports all of them at once.
    pub(super) fn into_table(self) -> Result<PriorityTable, TableErrors> {
        let mut errors = Vec::new();
        let default_business = business(self.default_business, "default_business", &mut errors);
        let rules = self
            .rules
            .into_iter()
            .enumerate()
            .map(|(i, rule)| Rule {
                business: business(rule.business, &format!("rules[{i}].business"), &mut errors),
                name: rule.name,
                matches: rule.matches.unwrap_or_default(),
            })
            .collect();
        let rekey_every =
            match humantime_serde::re::humantime::parse_duration(self.user.rekey_every.trim()) {
                Ok(d) => d,
                Err(e) => {
                    errors.push(TableError::new(
                        "user.rekey_every",
                        format!(
                            "`{}` is not a duration like `1h` or `30m`: {e}",
                            self.user.rekey_every
                        ),
                    ));
                    Duration::from_secs(1)
                }
            };
        let table = PriorityTable {
            version: self.version,
            default_business,
            rules,
            user: UserConfig { header: self.user.header, rekey_every },
            size_grade: self.size_grade,
        };
        errors.extend(table.validate());
        if errors.is_empty() {
            Ok(table)
        } else {
            Err(TableErrors(errors))
        }
    }
}

impl TryFrom<RawTable> for PriorityTable {
    type Error = TableErrors;

    fn try_from(raw: RawTable) -> Result<Self, TableErrors> {
        raw.into_table()
    }
}

impl Default for RawUser {
    fn default() -> Self {
        RawUser { header: DEFAULT_USER_HEADER.to_owned(), rekey_every: "1h".to_owned() }
    }
}

/// A business priority in `0..=255`; out of range records an error and yields the
/// least important class so the rest of the document can still be checked.
fn business(value: i64, path: &str, errors: &mut Vec<TableError>) -> u8 {
    u8::try_from(value).unwrap_or_else(|_| {
        errors.push(TableError::new(path, format!("{value} is out of range 0..=255")));
        u8::MAX
    })
}

fn parse_error<E: std::fmt::Display>(
    format: &str,
    e: serde_path_to_error::Error<E>,
) -> TableErrors {
    let path = e.path().to_string();
    // `serde_path_to_error` prints the root as "."; an empty path reads better.
    let path = if path == "." { String::new() } else { path };
    let message = e.inner().to_string();
    // serde_yaml prefixes its own copy of the path; say it once.
    let message = match message.split_once(": ") {
        Some((head, rest)) if !path.is_empty() && path.starts_with(head) => rest.to_owned(),
        _ => message,
    };
    TableErrors::one(path, format!("malformed {format}: {message}"))
}

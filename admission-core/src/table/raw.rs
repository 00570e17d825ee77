//! The document as parsed, before range checks.
//!
//! Numbers are read as `i64` and durations as text so that out-of-range values become
//! field errors collected together with every other problem, instead of serde stopping at
//! the first one.

use std::time::Duration;

use serde::Deserialize;

use super::{
    PriorityTable, Rule, RuleMatch, TableError, TableErrors, UserConfig, UserSchedule,
    DEFAULT_BUSINESS,
};
use crate::size_grade::SizeGradeConfig;
use crate::user_hash::{DEFAULT_CYCLE_PERIODS, MAX_CYCLE_PERIODS};

/// Largest table document accepted from any source (the control API has its own, equal
/// or smaller, body limit).
pub const MAX_DOCUMENT_BYTES: usize = 1 << 20;

/// Deepest nesting accepted; a table needs four or five levels.
pub const MAX_NESTING: usize = 32;

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
    schedule: String,
    cycle_periods: i64,
}

fn default_business() -> i64 {
    DEFAULT_BUSINESS.into()
}

// === impl RawTable ===

impl RawTable {
    pub(super) fn from_yaml(text: &str) -> Result<Self, TableErrors> {
        check_shape(text)?;
        let de = serde_yaml::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| parse_error("YAML", e))
    }

    pub(super) fn from_json(text: &str) -> Result<Self, TableErrors> {
        check_shape(text)?;
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
        let schedule = match self.user.schedule.trim() {
            "balanced" => UserSchedule::Balanced,
            "independent" => UserSchedule::Independent,
            other => {
                errors.push(TableError::new(
                    "user.schedule",
                    format!("`{other}` is not a schedule; use `balanced` or `independent`"),
                ));
                UserSchedule::default()
            }
        };
        let cycle_periods = match u32::try_from(self.user.cycle_periods) {
            Ok(n) => n,
            // Out of u32 range: the range check in validation names the bounds.
            Err(_) => {
                errors.push(TableError::new(
                    "user.cycle_periods",
                    format!("{} is out of range 1..={MAX_CYCLE_PERIODS}", self.user.cycle_periods),
                ));
                DEFAULT_CYCLE_PERIODS
            }
        };
        let table = PriorityTable {
            version: self.version,
            default_business,
            rules,
            user: UserConfig { header: self.user.header, rekey_every, schedule, cycle_periods },
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
        // The defaults live in `UserConfig::default()`; this only spells them as text.
        let user = UserConfig::default();
        let rekey_every = humantime_serde::re::humantime::format_duration(user.rekey_every);
        RawUser {
            header: user.header,
            rekey_every: rekey_every.to_string(),
            schedule: user.schedule.as_str().to_owned(),
            cycle_periods: user.cycle_periods.into(),
        }
    }
}

/// Refuses, before any parser sees it, a document that is empty, larger than
/// [`MAX_DOCUMENT_BYTES`] or nested deeper than [`MAX_NESTING`]. libyaml's time grows with
/// the square of the nesting of flow collections (`[[[[...`): 195 KiB of `[` cost 51 s of
/// CPU. A real table nests four levels deep. One linear pass, no allocation.
fn check_shape(text: &str) -> Result<(), TableErrors> {
    if text.len() > MAX_DOCUMENT_BYTES {
        return Err(TableErrors::one(
            "",
            format!(
                "malformed document: {} bytes; at most {MAX_DOCUMENT_BYTES} are allowed",
                text.len()
            ),
        ));
    }
    if text.trim().is_empty() {
        return Err(TableErrors::one(
            "",
            "malformed document: empty; send a table (an empty table is `rules: []`)",
        ));
    }
    let depth = nesting_depth(text, MAX_NESTING);
    if depth > MAX_NESTING {
        return Err(TableErrors::one(
            "",
            format!("malformed document: nested more than {MAX_NESTING} levels deep"),
        ));
    }
    Ok(())
}

/// The deepest nesting of `[`/`{` collections and block indentation levels, counting
/// stops once past `limit`. Brackets inside quoted scalars and comments do not count.
/// Block nesting is approximated by indentation steps of the lines, which over-counts
/// nothing a table needs: `rules:` / `- name:` / `match:` / `header:` is four.
///
/// As in YAML, a `[` or `{` opens a collection, and a quote starts a quoted scalar, only
/// where a node starts (the line's start, after `- `, `: `, `? `, and inside a flow
/// collection after `[`, `{`, `,`, `:`); elsewhere they are text of a plain scalar (`x[1]`,
/// `it's`), which the YAML a table serialises to may hold.
fn nesting_depth(text: &str, limit: usize) -> usize {
    let mut deepest = 0;
    let mut flow = 0usize;
    for line in text.lines() {
        let indent = line.len() - line.trim_start_matches([' ', '-']).len();
        // One level per two columns of indentation (or `- ` of a nested sequence).
        deepest = deepest.max(indent.div_ceil(2));
        let mut quote: Option<u8> = None;
        let mut node_start = true;
        let mut indicator = false;
        let mut previous = b' ';
        let bytes = line.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            match quote {
                Some(b'"') if b == b'\\' => i += 1, // skip the escaped character
                Some(b'\'') if b == b'\'' && bytes.get(i + 1) == Some(&b'\'') => i += 1, // `''`
                Some(q) if b == q => quote = None,
                Some(_) => {}
                None => match b {
                    b'"' | b'\'' if node_start => quote = Some(b),
                    b'#' if previous == b' ' || previous == b'\t' || i == 0 => break,
                    b'[' | b'{' if node_start || flow > 0 => {
                        flow += 1;
                        deepest = deepest.max(flow + indent.div_ceil(2));
                    }
                    b']' | b'}' => flow = flow.saturating_sub(1),
                    _ => {}
                },
            }
            // `: ` always indicates a value; `- ` and `? ` only where a node could start.
            let indicates = b == b':' || (node_start && matches!(b, b'-' | b'?'));
            node_start = quote.is_none()
                && match b {
                    b' ' | b'\t' => node_start || indicator,
                    // In a flow collection, also `"a":"b"` (JSON) and `[a,b]`.
                    b'[' | b'{' | b',' | b':' => flow > 0,
                    _ => false,
                };
            indicator = quote.is_none() && indicates;
            if deepest > limit {
                return deepest;
            }
            previous = b;
            i += 1;
        }
    }
    deepest
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
    TableErrors(vec![super::error::from_path_error(format, e)])
}

//! The priority table (docs/design.md, "Priority table format"): which business priority
//! each request gets at the entry.
//!
//! The table is an ordered list of rules, first match wins, with a default for requests no
//! rule matches. Three stages, each with its own type:
//! - [`PriorityTable`]: the document as written (YAML or JSON), with `serde`.
//! - validation in [`PriorityTable::compile`], which reports *every* problem at once, each
//!   naming its field path (`rules[2].match.path_prefix`), so an operator fixes a table in
//!   one round trip instead of one error at a time.
//! - [`CompiledTable`]: an immutable snapshot whose [`CompiledTable::classify`] allocates
//!   nothing and indexes exact paths, so it can sit on the request path behind an `ArcSwap`.

mod compiled;
pub(crate) mod error;
mod path;
mod raw;
mod validate;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::size_grade::SizeGradeConfig;
use crate::user_hash::{RekeySchedule, UserPriorityHasher, DEFAULT_CYCLE_PERIODS};

pub use self::compiled::{Classification, CompiledTable, RequestView};
pub use self::error::{from_yaml_str, FieldError, TableError, TableErrors};
pub use self::path::{normalize_path, PathError};
pub use self::raw::{MAX_DOCUMENT_BYTES, MAX_NESTING};
pub use self::validate::{check_reserved_header, RESERVED_HEADERS};

/// The table shipped in the binary, used when no other source is configured.
pub const EMBEDDED_DEFAULT_YAML: &str = include_str!("default-table.yaml");

/// Business priority of requests no rule matches, when the document does not say.
pub const DEFAULT_BUSINESS: u8 = 200;

/// Default name of the header carrying the user id at the entry.
pub const DEFAULT_USER_HEADER: &str = "x-user-id";

/// Upper bound on rules per table. Validation compares rule pairs for shadowing, and a
/// table this size is already far beyond what a person can review.
pub const MAX_RULES: usize = 4096;

/// The priority table as written by an operator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "raw::RawTable")]
pub struct PriorityTable {
    /// Set by the control API on every accepted change; ignored on input there.
    pub version: u64,
    /// Business priority of requests no rule matches.
    pub default_business: u8,
    /// First match wins.
    pub rules: Vec<Rule>,
    pub user: UserConfig,
    /// Optional content-length grade for requests no rule matches (docs/design.md,
    /// "Priority table format").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_grade: Option<SizeGradeConfig>,
}

/// One rule: when every condition of `matches` holds, the request gets `business`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Unique within the table; shows up in audits and errors.
    pub name: String,
    #[serde(rename = "match")]
    pub matches: RuleMatch,
    pub business: u8,
}

/// The conditions of a rule; all present conditions must hold. At least one is required.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuleMatch {
    /// Exact, case-sensitive HTTP method (`POST`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Exact path, without the query string.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Path prefix, compared byte for byte (`/api/pay/` does not match `/api/pay`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// Host, case-insensitive; without a port it matches the host on any port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Header name (case-insensitive) to exact value (case-sensitive).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub header: BTreeMap<String, String>,
}

/// How the entry derives the user priority.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UserConfig {
    /// Header carrying the user id.
    pub header: String,
    /// Re-key period of the user hash (`1h`).
    #[serde(with = "humantime_serde")]
    pub rekey_every: Duration,
    /// How user levels change from one period to the next (`balanced`; docs/design.md,
    /// "Priorities").
    pub schedule: UserSchedule,
    /// Periods per cycle of the balanced schedule (`24`, `1..=1024`); over a cycle every
    /// user is admitted within one period of every other. Ignored by `independent`.
    pub cycle_periods: u32,
}

/// The re-key schedule of the user hash, as written in the table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UserSchedule {
    /// Every user visits every part of the level range once per cycle, in a secret order.
    #[default]
    Balanced,
    /// A fresh, independent key every period (DAGOR as published).
    Independent,
}

// === impl PriorityTable ===

impl PriorityTable {
    /// Parses a YAML document. Reports every range error at once; structural errors
    /// (wrong type, unknown field) stop parsing and name their path.
    pub fn from_yaml(text: &str) -> Result<Self, TableErrors> {
        raw::RawTable::from_yaml(text)?.into_table()
    }

    /// Parses a JSON document; same error behaviour as [`PriorityTable::from_yaml`].
    pub fn from_json(text: &str) -> Result<Self, TableErrors> {
        raw::RawTable::from_json(text)?.into_table()
    }

    pub fn to_yaml(&self) -> String {
        // Serialising plain data structs with string keys cannot fail.
        serde_yaml::to_string(self).unwrap_or_default()
    }

    pub fn to_json_pretty(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// The table compiled into the binary (`default-table.yaml`).
    pub fn embedded_default() -> Self {
        // A unit test proves the embedded document parses and compiles.
        Self::from_yaml(EMBEDDED_DEFAULT_YAML).unwrap_or_else(|_| Self::empty())
    }

    /// No rules: everything gets [`DEFAULT_BUSINESS`].
    pub fn empty() -> Self {
        PriorityTable {
            version: 0,
            default_business: DEFAULT_BUSINESS,
            rules: Vec::new(),
            user: UserConfig::default(),
            size_grade: None,
        }
    }

    /// Every problem with the table, each naming its field path. Empty when valid.
    pub fn validate(&self) -> Vec<TableError> {
        validate::validate(self)
    }

    /// Validates and compiles with an empty user-hash secret. Entry sidecars that stamp
    /// user priorities should use [`PriorityTable::compile_with_secret`].
    pub fn compile(&self) -> Result<CompiledTable, TableErrors> {
        self.compile_with_secret(&[])
    }

    /// Validates and compiles; the secret keys the user-priority hash.
    pub fn compile_with_secret(&self, secret: &[u8]) -> Result<CompiledTable, TableErrors> {
        let errors = self.validate();
        if !errors.is_empty() {
            return Err(TableErrors(errors));
        }
        Ok(CompiledTable::new(self.clone(), secret.into()))
    }
}

// === impl UserConfig ===

impl Default for UserConfig {
    fn default() -> Self {
        UserConfig {
            header: DEFAULT_USER_HEADER.to_owned(),
            rekey_every: UserPriorityHasher::DEFAULT_REKEY,
            schedule: UserSchedule::default(),
            cycle_periods: DEFAULT_CYCLE_PERIODS,
        }
    }
}

impl UserConfig {
    /// The hasher's schedule for these settings.
    pub fn rekey_schedule(&self) -> RekeySchedule {
        match self.schedule {
            UserSchedule::Balanced => RekeySchedule::Balanced { cycle_periods: self.cycle_periods },
            UserSchedule::Independent => RekeySchedule::Independent,
        }
    }
}

impl UserSchedule {
    pub fn as_str(self) -> &'static str {
        match self {
            UserSchedule::Balanced => "balanced",
            UserSchedule::Independent => "independent",
        }
    }
}

// === impl RuleMatch ===

impl RuleMatch {
    /// No conditions at all: matches every request.
    pub fn is_empty(&self) -> bool {
        self.method.is_none()
            && self.path.is_none()
            && self.path_prefix.is_none()
            && self.host.is_none()
            && self.header.is_empty()
    }
}

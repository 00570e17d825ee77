//! The compiled, immutable table on the request path.
//!
//! Rules keep their order (first match wins). Rules with an exact `path` are also indexed
//! by that path, so a table of many endpoint rules costs one hash lookup plus the few
//! non-path rules, not a scan of every rule. `classify` never allocates.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use super::validate::{has_port, strip_port};
use super::{PriorityTable, RuleMatch, TableErrors};
use crate::size_grade::SizeGrade;
use crate::user_hash::UserPriorityHasher;

/// Exact-path rules are hashed only when there are more than this many.
const INDEX_MIN_EXACT_RULES: usize = 8;

/// What the classifier needs from a request. Implemented by the proxy over its request
/// header; `path` is the path without the query string (a `?...` suffix is ignored anyway).
pub trait RequestView {
    fn method(&self) -> &str;
    fn path(&self) -> &str;
    /// The `:authority` or `Host`, possibly with a port.
    fn host(&self) -> Option<&str>;
    /// First value of a header; `name` is lower case.
    fn header(&self, name: &str) -> Option<&[u8]>;
}

/// The business priority a request gets and the index of the rule that gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classification {
    pub business: u8,
    /// `None` when no rule matched and `default_business` applied.
    pub rule: Option<usize>,
}

/// A validated table compiled for matching. Immutable; swap a new one in to change it.
pub struct CompiledTable {
    source: PriorityTable,
    rules: Box<[CompiledRule]>,
    /// Rule indexes by exact path, ascending.
    by_path: HashMap<Box<str>, Box<[u32]>>,
    /// Indexes of the rules without an exact path, ascending.
    general: Box<[u32]>,
    /// Bit set of every business class this table can assign.
    produced: [u64; 4],
    least_important: u8,
    size_grade: Option<SizeGrade>,
    user_header: Box<str>,
    hasher: UserPriorityHasher,
    secret: Arc<[u8]>,
}

struct CompiledRule {
    method: Option<Box<str>>,
    path: PathMatch,
    host: Option<HostMatch>,
    headers: Box<[HeaderMatch]>,
    business: u8,
}

/// Lower-case name, exact value.
type HeaderMatch = (Box<str>, Box<[u8]>);

enum PathMatch {
    Any,
    Exact(Box<str>),
    Prefix(Box<str>),
}

struct HostMatch {
    host: Box<str>,
    /// The rule's host carries no port, so the request's port is ignored.
    any_port: bool,
}

// === impl CompiledTable ===

impl CompiledTable {
    /// Only for validated tables; see [`PriorityTable::compile_with_secret`].
    pub(super) fn new(source: PriorityTable, secret: Arc<[u8]>) -> Self {
        let rules: Box<[CompiledRule]> =
            source.rules.iter().map(|r| CompiledRule::new(&r.matches, r.business)).collect();
        // Below a handful of exact-path rules, comparing them in a scan is cheaper than
        // hashing the request path.
        let exact_rules = rules.iter().filter(|r| matches!(r.path, PathMatch::Exact(_))).count();
        let index_paths = exact_rules > INDEX_MIN_EXACT_RULES;
        let mut by_path: HashMap<Box<str>, Vec<u32>> = HashMap::new();
        let mut general = Vec::new();
        for (i, rule) in rules.iter().enumerate() {
            match &rule.path {
                PathMatch::Exact(p) if index_paths => {
                    by_path.entry(p.clone()).or_default().push(i as u32)
                }
                _ => general.push(i as u32),
            }
        }
        let mut produced = [0u64; 4];
        let mut mark = |b: u8| produced[usize::from(b / 64)] |= 1 << (b % 64);
        mark(source.default_business);
        source.rules.iter().for_each(|r| mark(r.business));
        // Validation already checked the size grade; a failure here cannot happen.
        let size_grade = source.size_grade.as_ref().and_then(|c| SizeGrade::new(c).ok());
        let graded = size_grade.iter().flat_map(|g| g.business_classes());
        graded.clone().for_each(&mut mark);
        let least_important = source
            .rules
            .iter()
            .map(|r| r.business)
            .chain(graded)
            .fold(source.default_business, u8::max);
        CompiledTable {
            by_path: by_path.into_iter().map(|(k, v)| (k, v.into_boxed_slice())).collect(),
            general: general.into_boxed_slice(),
            rules,
            produced,
            least_important,
            size_grade,
            user_header: source.user.header.to_ascii_lowercase().into_boxed_str(),
            hasher: UserPriorityHasher::with_schedule(
                secret.to_vec(),
                source.user.rekey_every,
                source.user.rekey_schedule(),
            ),
            secret,
            source,
        }
    }

    /// Validates and compiles `next` with this table's user-hash secret.
    pub fn compile_next(&self, next: &PriorityTable) -> Result<CompiledTable, TableErrors> {
        let errors = next.validate();
        if !errors.is_empty() {
            return Err(TableErrors(errors));
        }
        Ok(CompiledTable::new(next.clone(), self.secret.clone()))
    }

    pub fn version(&self) -> u64 {
        self.source.version
    }

    /// The business priority of a request: the first matching rule's, else the default.
    pub fn classify(&self, req: &(impl RequestView + ?Sized)) -> Classification {
        let full_path = req.path();
        let path = full_path.split_once('?').map_or(full_path, |(p, _)| p);
        let exact: &[u32] =
            if self.by_path.is_empty() { &[] } else { self.by_path.get(path).map_or(&[], |v| v) };
        // Merge the two ascending index lists so the first match in table order wins.
        let (mut e, mut g) = (exact.iter().peekable(), self.general.iter().peekable());
        loop {
            let next = match (e.peek(), g.peek()) {
                (Some(&&a), Some(&&b)) if a < b => e.next(),
                (Some(_), Some(_)) | (None, Some(_)) => g.next(),
                (Some(_), None) => e.next(),
                (None, None) => break,
            };
            let Some(&i) = next else { break };
            let rule = &self.rules[i as usize];
            if rule.matches(req, path) {
                return Classification { business: rule.business, rule: Some(i as usize) };
            }
        }
        Classification { business: self.source.default_business, rule: None }
    }

    /// Name of the rule at `index`, for logs and audits.
    pub fn rule_name(&self, index: usize) -> Option<&str> {
        self.source.rules.get(index).map(|r| r.name.as_str())
    }

    /// The content-length grade, when the table configures one (docs/design.md, "Priority
    /// table format").
    pub fn size_grade(&self) -> Option<&SizeGrade> {
        self.size_grade.as_ref()
    }

    /// Lower-case name of the header carrying the user id.
    pub fn user_header(&self) -> &str {
        &self.user_header
    }

    pub fn user_hasher(&self) -> &UserPriorityHasher {
        &self.hasher
    }

    /// Whether some rule, or the default, assigns `business`.
    pub fn produces(&self, business: u8) -> bool {
        self.produced[usize::from(business / 64)] & (1 << (business % 64)) != 0
    }

    /// The table as written (with its version).
    pub fn source(&self) -> &PriorityTable {
        &self.source
    }

    /// The largest (least important) business value the table assigns: the level given
    /// to requests with missing or malformed priority headers on inner hops.
    pub fn least_important_business(&self) -> u8 {
        self.least_important
    }
}

impl fmt::Debug for CompiledTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The secret stays out of logs.
        f.debug_struct("CompiledTable")
            .field("version", &self.version())
            .field("rules", &self.rules.len())
            .field("default_business", &self.source.default_business)
            .finish_non_exhaustive()
    }
}

// === impl CompiledRule ===

impl CompiledRule {
    fn new(m: &RuleMatch, business: u8) -> Self {
        let path = match (&m.path, &m.path_prefix) {
            (Some(p), _) => PathMatch::Exact(p.as_str().into()),
            (None, Some(p)) => PathMatch::Prefix(p.as_str().into()),
            (None, None) => PathMatch::Any,
        };
        CompiledRule {
            method: m.method.as_deref().map(Into::into),
            path,
            host: m.host.as_deref().map(|h| HostMatch { host: h.into(), any_port: !has_port(h) }),
            headers: m
                .header
                .iter()
                .map(|(n, v)| (n.to_ascii_lowercase().into_boxed_str(), v.as_bytes().into()))
                .collect(),
            business,
        }
    }

    #[inline]
    fn matches(&self, req: &(impl RequestView + ?Sized), path: &str) -> bool {
        let path_ok = match &self.path {
            PathMatch::Any => true,
            PathMatch::Exact(p) => path == &**p,
            PathMatch::Prefix(p) => path.starts_with(&**p),
        };
        path_ok
            && self.method.as_deref().is_none_or(|m| req.method() == m)
            && self.host.as_ref().is_none_or(|h| req.host().is_some_and(|got| h.matches(got)))
            && self.headers.iter().all(|(name, value)| req.header(name) == Some(&**value))
    }
}

// === impl HostMatch ===

impl HostMatch {
    fn matches(&self, got: &str) -> bool {
        let got = if self.any_port { strip_port(got) } else { got };
        got.eq_ignore_ascii_case(&self.host)
    }
}

//! Compound priorities, admission levels and their header encodings (docs/design.md,
//! "Priorities" and "Wire contract").
//!
//! Lower numbers are more important. `(b1, u1)` is more important than `(b2, u2)`
//! iff `b1 < b2`, or `b1 == b2 && u1 < u2`; the derived `Ord` on the field order
//! gives exactly that lexicographic order.

use std::fmt;

/// Number of user-priority levels inside one business level.
pub const USER_LEVELS: u16 = 128;
/// Largest valid user priority.
pub const MAX_USER: u8 = (USER_LEVELS - 1) as u8;
/// Number of distinct compound levels (`256 * 128`).
pub const COMPOUND_LEVELS: usize = 256 * USER_LEVELS as usize;

/// A request's compound priority: business first, then user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Priority {
    pub business: u8,
    /// Always `0..=127`; constructors enforce it.
    pub user: u8,
}

/// The least important level a sidecar still admits: a request is admitted iff
/// its priority is `<=` the level. `255.127` admits everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AdmissionLevel(Priority);

/// Why a header value was not accepted. Never a panic: callers fall back to the
/// configured default and count the error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeaderValueError {
    #[error("empty value")]
    Empty,
    #[error("surrounding whitespace")]
    Padded,
    #[error("negative value")]
    Negative,
    #[error("not a decimal number")]
    NotNumeric,
    #[error("value out of range (max {max})")]
    OutOfRange { max: u16 },
    #[error("header repeated")]
    Repeated,
    #[error("expected `business.user`")]
    MissingSeparator,
}

// === impl Priority ===

impl Priority {
    /// The most important priority.
    pub const MOST_IMPORTANT: Priority = Priority { business: 0, user: 0 };
    /// The least important priority.
    pub const LEAST_IMPORTANT: Priority = Priority { business: u8::MAX, user: MAX_USER };

    /// Builds a priority; `None` when `user > 127`.
    pub const fn new(business: u8, user: u8) -> Option<Self> {
        if user > MAX_USER {
            None
        } else {
            Some(Priority { business, user })
        }
    }

    /// Dense index `business * 128 + user`, in importance order. Also the value of
    /// the `weir_admission_level` gauge.
    #[inline]
    pub const fn compound(self) -> u16 {
        self.business as u16 * USER_LEVELS + self.user as u16
    }

    /// Inverse of [`Priority::compound`]; `None` above `255 * 128 + 127`.
    #[inline]
    pub const fn from_compound(c: u16) -> Option<Self> {
        if c as usize >= COMPOUND_LEVELS {
            return None;
        }
        Some(Priority { business: (c / USER_LEVELS) as u8, user: (c % USER_LEVELS) as u8 })
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.business, self.user)
    }
}

// === impl AdmissionLevel ===

impl AdmissionLevel {
    /// Admits every request.
    pub const FULLY_OPEN: AdmissionLevel = AdmissionLevel(Priority::LEAST_IMPORTANT);

    pub const fn new(p: Priority) -> Self {
        AdmissionLevel(p)
    }

    pub const fn priority(self) -> Priority {
        self.0
    }

    #[inline]
    pub const fn compound(self) -> u16 {
        self.0.compound()
    }

    #[inline]
    pub const fn from_compound(c: u16) -> Option<Self> {
        match Priority::from_compound(c) {
            Some(p) => Some(AdmissionLevel(p)),
            None => None,
        }
    }

    /// `true` iff a request of priority `p` passes this level.
    #[inline]
    pub fn admits(self, p: Priority) -> bool {
        p <= self.0
    }

    /// Parses a `x-admission-level` value such as `3.64`.
    pub fn parse(value: &[u8]) -> Result<Self, HeaderValueError> {
        check_padding(value)?;
        let dot =
            value.iter().position(|&b| b == b'.').ok_or(HeaderValueError::MissingSeparator)?;
        let business = parse_decimal(&value[..dot], u8::MAX as u16)? as u8;
        let user = parse_decimal(&value[dot + 1..], MAX_USER as u16)? as u8;
        Ok(AdmissionLevel(Priority { business, user }))
    }

    /// Formats as `B.U` into a stack buffer (no allocation on the response path).
    pub fn encode(self) -> EncodedLevel {
        let mut buf = [0u8; 7];
        let mut len = write_decimal(&mut buf, self.0.business as u16);
        buf[len] = b'.';
        len += 1;
        len += write_decimal(&mut buf[len..], self.0.user as u16);
        EncodedLevel { buf, len: len as u8 }
    }
}

impl Default for AdmissionLevel {
    fn default() -> Self {
        Self::FULLY_OPEN
    }
}

impl fmt::Display for AdmissionLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// `B.U` as bytes, at most `255.127` (7 bytes).
#[derive(Debug, Clone, Copy)]
pub struct EncodedLevel {
    buf: [u8; 7],
    len: u8,
}

impl EncodedLevel {
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len as usize]
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII digits and '.' are ever written.
        std::str::from_utf8(self.as_bytes()).unwrap_or("255.127")
    }
}

// === header parsing ===

/// Parses `x-business-priority` (`0..=255`).
pub fn parse_business(value: &[u8]) -> Result<u8, HeaderValueError> {
    check_padding(value)?;
    parse_decimal(value, u8::MAX as u16).map(|v| v as u8)
}

/// Parses `x-user-priority` (`0..=127`).
pub fn parse_user(value: &[u8]) -> Result<u8, HeaderValueError> {
    check_padding(value)?;
    parse_decimal(value, MAX_USER as u16).map(|v| v as u8)
}

fn check_padding(value: &[u8]) -> Result<(), HeaderValueError> {
    match (value.first(), value.last()) {
        (None, _) => Err(HeaderValueError::Empty),
        (Some(f), Some(l)) if f.is_ascii_whitespace() || l.is_ascii_whitespace() => {
            Err(HeaderValueError::Padded)
        }
        _ => Ok(()),
    }
}

/// Strict unsigned decimal: digits only, no sign, no leading `+`, at most `max`.
/// Leading zeros are accepted (`007` is 7) since some clients zero-pad.
fn parse_decimal(s: &[u8], max: u16) -> Result<u16, HeaderValueError> {
    if s.is_empty() {
        return Err(HeaderValueError::Empty);
    }
    if s[0] == b'-' {
        return Err(HeaderValueError::Negative);
    }
    let mut v: u32 = 0;
    for &b in s {
        if !b.is_ascii_digit() {
            return Err(HeaderValueError::NotNumeric);
        }
        v = v * 10 + (b - b'0') as u32;
        if v > max as u32 {
            return Err(HeaderValueError::OutOfRange { max });
        }
    }
    Ok(v as u16)
}

fn write_decimal(buf: &mut [u8], v: u16) -> usize {
    let digits = if v >= 100 {
        3
    } else if v >= 10 {
        2
    } else {
        1
    };
    let mut x = v;
    for i in (0..digits).rev() {
        buf[i] = b'0' + (x % 10) as u8;
        x /= 10;
    }
    digits
}

#[cfg(test)]
mod tests;

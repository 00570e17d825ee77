//! The Prometheus text exposition weir's `/metrics` serves, parsed once for every reader in
//! the test tree (the e2e tests, the egress benchmark): `name{label="value",...} number`
//! lines into series, comments and blank lines skipped.

use std::collections::BTreeMap;

/// One series: its name, its labels and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed exposition.
#[derive(Debug, Clone, Default)]
pub struct Metrics(Vec<Series>);

impl Metrics {
    pub fn parse(text: &str) -> Self {
        let series = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(parse_line)
            .collect();
        Metrics(series)
    }

    /// Every series of the exposition.
    pub fn all(&self) -> &[Series] {
        &self.0
    }

    /// Every series called `name`: its labels and value.
    pub fn series<'a>(
        &'a self,
        name: &'a str,
    ) -> impl Iterator<Item = (&'a BTreeMap<String, String>, f64)> + 'a {
        self.0.iter().filter(move |s| s.name == name).map(|s| (&s.labels, s.value))
    }

    /// The series written exactly as `series` (`name` or `name{a="1",b="2"}`, labels in any
    /// order, all of them): its value, or `None` when absent.
    pub fn get(&self, series: &str) -> Option<f64> {
        let wanted = parse_line(&format!("{series} 0"))?;
        self.0.iter().find(|s| s.name == wanted.name && s.labels == wanted.labels).map(|s| s.value)
    }

    /// [`Metrics::get`], 0 when absent (a counter not yet incremented is not exported).
    pub fn value(&self, series: &str) -> f64 {
        self.get(series).unwrap_or(0.0)
    }

    /// The sum of every series called `name` whose labels include all of `labels` (the other
    /// labels summed over).
    pub fn sum_where(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    /// `name{role, outcome}` summed over the other labels (the business class): the usual
    /// reading of `weir_requests_total`.
    pub fn sum(&self, name: &str, role: &str, outcome: &str) -> f64 {
        self.sum_where(name, &[("role", role), ("outcome", outcome)])
    }

    /// The series called `name` whose labels include all of `labels`.
    pub fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Series> + 'a {
        self.0.iter().filter(move |s| {
            s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).is_some_and(|x| x == v))
        })
    }

    /// The value of the first series called `name`, whatever its labels.
    pub fn first(&self, name: &str) -> Option<f64> {
        self.0.iter().find(|s| s.name == name).map(|s| s.value)
    }
}

/// `name{labels} value` (an optional timestamp after the value is ignored).
fn parse_line(line: &str) -> Option<Series> {
    let (head, tail) = match line.find('{') {
        Some(open) => {
            let close = open + line[open..].rfind('}')?;
            (&line[..=close], &line[close + 1..])
        }
        None => line.split_once(' ')?,
    };
    let value = tail.split_whitespace().next()?.parse::<f64>().ok()?;
    let (name, labels) = match head.split_once('{') {
        Some((name, rest)) => (name, parse_labels(rest.strip_suffix('}')?)),
        None => (head, BTreeMap::new()),
    };
    Some(Series { name: name.trim().to_string(), labels, value })
}

/// `a="1",b="x\"y"`: values unescaped (`\\`, `\"`, `\n`).
fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while let Some((key, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, other)) => value.push(other),
                    None => break,
                },
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.insert(key.trim_start_matches(',').trim().to_string(), value);
        rest = &after[end..];
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP weir_requests_total Requests.\n\
         # TYPE weir_requests_total counter\n\
         weir_requests_total{role=\"egress\",business=\"1\",outcome=\"shed_downstream\"} 5\n\
         weir_requests_total{role=\"egress\",business=\"2\",outcome=\"shed_downstream\"} 7\n\
         weir_requests_total{role=\"inbound\",business=\"2\",outcome=\"shed_overload\"} 3\n\
         weir_downstream_level{authority=\"127.0.0.1:9\"} 200\n\
         weir_table_info{digest=\"a\\\"b\",version=\"7\"} 1\n\
         \n\
         weir_admission_level 32767\n";

    #[test]
    fn series_are_read_by_name_and_labels() {
        let m = Metrics::parse(TEXT);
        assert_eq!(m.all().len(), 6);
        assert_eq!(m.sum("weir_requests_total", "egress", "shed_downstream"), 12.0);
        assert_eq!(m.sum("weir_requests_total", "inbound", "admitted"), 0.0);
        assert_eq!(m.sum_where("weir_requests_total", &[("role", "inbound")]), 3.0);
        assert_eq!(m.sum_where("weir_requests_total", &[("business", "2")]), 10.0);
        assert_eq!(m.first("weir_downstream_level"), Some(200.0));
        assert_eq!(m.first("weir_nothing"), None);
        let levels: Vec<_> = m.series("weir_downstream_level").collect();
        assert_eq!(levels.len(), 1);
        assert_eq!(levels[0].0.get("authority").map(String::as_str), Some("127.0.0.1:9"));
    }

    #[test]
    fn one_series_is_found_whatever_the_label_order() {
        let m = Metrics::parse(TEXT);
        let a = "weir_requests_total{role=\"egress\",business=\"2\",outcome=\"shed_downstream\"}";
        let b = "weir_requests_total{outcome=\"shed_downstream\",business=\"2\",role=\"egress\"}";
        assert_eq!(m.get(a), Some(7.0));
        assert_eq!(m.get(b), Some(7.0));
        // All the labels: a subset is not the series.
        assert_eq!(m.get("weir_requests_total{role=\"egress\"}"), None);
        assert_eq!(m.value("weir_admission_level"), 32767.0);
        assert_eq!(m.value("weir_absent_total"), 0.0);
        let info = m.matching("weir_table_info", &[]).next().unwrap();
        assert_eq!(info.labels["digest"], "a\"b");
        assert_eq!(info.labels["version"], "7");
    }
}

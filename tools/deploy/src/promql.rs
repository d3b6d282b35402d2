//! Just enough PromQL to name what a query reads: every series selector (metric name and the
//! label names it matches on), every label named in `by`/`without`/`on`/`ignoring`/`group_*`
//! lists, and every function it calls. Values, durations and operators are skipped. Grafana's
//! `$variables` are accepted wherever they stand.

/// A series selector: `name{label="…", …}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    pub metric: String,
    pub labels: Vec<String>,
}

/// What one expression reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query {
    pub selectors: Vec<Selector>,
    /// Labels named in `by (…)`, `without (…)`, `on (…)`, `ignoring (…)`, `group_left (…)`,
    /// `group_right (…)`.
    pub grouping: Vec<String>,
    pub functions: Vec<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("unterminated {what} at byte {at}")]
    Unterminated { what: &'static str, at: usize },
    #[error("a selector without a metric name at byte {at} (name the metric)")]
    NamelessSelector { at: usize },
    #[error("unexpected {found:?} in a label matcher at byte {at}")]
    BadMatcher { found: String, at: usize },
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Open,
    Close,
    OpenBrace,
    CloseBrace,
    Str,
    /// Numbers, durations, ranges, operators, variables: nothing that names a series.
    Other(char),
}

fn lex(expr: &str) -> Result<Vec<(usize, Tok)>, ParseError> {
    let b = expr.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i] as char;
        let start = i;
        match c {
            c if c.is_ascii_whitespace() => i += 1,
            '#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            '(' => {
                out.push((start, Tok::Open));
                i += 1;
            }
            ')' => {
                out.push((start, Tok::Close));
                i += 1;
            }
            '{' => {
                out.push((start, Tok::OpenBrace));
                i += 1;
            }
            '}' => {
                out.push((start, Tok::CloseBrace));
                i += 1;
            }
            '[' => {
                // A range or subquery: durations and Grafana variables only.
                while i < b.len() && b[i] != b']' {
                    i += 1;
                }
                if i == b.len() {
                    return Err(ParseError::Unterminated {
                        what: "range",
                        at: start,
                    });
                }
                i += 1;
                out.push((start, Tok::Other('[')));
            }
            '"' | '\'' | '`' => {
                i += 1;
                while i < b.len() && b[i] as char != c {
                    if b[i] == b'\\' && c != '`' {
                        i += 1;
                    }
                    i += 1;
                }
                if i >= b.len() {
                    return Err(ParseError::Unterminated {
                        what: "string",
                        at: start,
                    });
                }
                i += 1;
                out.push((start, Tok::Str));
            }
            '$' => {
                // `$name`, `$__rate_interval`, `${name}`, `${name:format}`.
                i += 1;
                if i < b.len() && b[i] == b'{' {
                    while i < b.len() && b[i] != b'}' {
                        i += 1;
                    }
                    i += 1;
                } else {
                    while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                        i += 1;
                    }
                }
                out.push((start, Tok::Other('$')));
            }
            c if c.is_ascii_digit() || c == '.' => {
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                    i += 1;
                }
                out.push((start, Tok::Other('0')));
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b':')
                {
                    i += 1;
                }
                out.push((start, Tok::Ident(expr[start..i].to_owned())));
            }
            other => {
                out.push((start, Tok::Other(other)));
                i += other.len_utf8();
            }
        }
    }
    Ok(out)
}

const GROUPING: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
/// Aggregation operators, which may put `by (…)`/`without (…)` before their parenthesis.
const AGGREGATIONS: &[&str] = &[
    "sum",
    "avg",
    "min",
    "max",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "group",
    "count_values",
];
const KEYWORDS: &[&str] = &[
    "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan",
];

/// Parses `expr` into what it reads.
pub fn parse(expr: &str) -> Result<Query, ParseError> {
    let toks = lex(expr)?;
    let mut q = Query::default();
    let mut i = 0;
    while i < toks.len() {
        let (at, tok) = &toks[i];
        let next = toks.get(i + 1).map(|(_, t)| t);
        match tok {
            Tok::Ident(name) if GROUPING.contains(&name.as_str()) => {
                i += 1;
                if next == Some(&Tok::Open) {
                    i += 1;
                    while let Some((_, t)) = toks.get(i) {
                        i += 1;
                        match t {
                            Tok::Ident(l) => q.grouping.push(l.clone()),
                            Tok::Close => break,
                            _ => {}
                        }
                    }
                }
            }
            Tok::Ident(name) if KEYWORDS.contains(&name.to_ascii_lowercase().as_str()) => i += 1,
            Tok::Ident(name)
                if next == Some(&Tok::Open)
                    || (AGGREGATIONS.contains(&name.as_str())
                        && matches!(next, Some(Tok::Ident(m)) if m == "by" || m == "without")) =>
            {
                q.functions.push(name.clone());
                i += 1;
            }
            Tok::Ident(name) => {
                let mut sel = Selector {
                    metric: name.clone(),
                    labels: Vec::new(),
                };
                i += 1;
                if next == Some(&Tok::OpenBrace) {
                    i = matchers(&toks, i + 1, &mut sel.labels)?;
                }
                q.selectors.push(sel);
            }
            Tok::OpenBrace => return Err(ParseError::NamelessSelector { at: *at }),
            _ => i += 1,
        }
    }
    Ok(q)
}

/// Reads `label op "value", …}` from `i`; returns the index after the closing brace.
fn matchers(
    toks: &[(usize, Tok)],
    mut i: usize,
    labels: &mut Vec<String>,
) -> Result<usize, ParseError> {
    loop {
        let Some((at, t)) = toks.get(i) else {
            return Err(ParseError::Unterminated {
                what: "label matchers",
                at: toks.last().map_or(0, |(a, _)| *a),
            });
        };
        i += 1;
        match t {
            Tok::CloseBrace => return Ok(i),
            Tok::Ident(l) => labels.push(l.clone()),
            Tok::Str | Tok::Other('=' | '!' | '~' | ',') => {}
            other => {
                return Err(ParseError::BadMatcher {
                    found: format!("{other:?}"),
                    at: *at,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_groupings_and_functions_are_found() {
        let q = parse(
            r#"sum by (reason) (rate(policy_serving_turns_dropped_total{job=~"$job", reason!="x"}[$__rate_interval]))
               / on() group_left sum(rate(policy_serving_teacher_seconds_count[5m] offset 1h))"#,
        )
        .unwrap();
        assert_eq!(
            q.selectors,
            vec![
                Selector {
                    metric: "policy_serving_turns_dropped_total".into(),
                    labels: vec!["job".into(), "reason".into()],
                },
                Selector {
                    metric: "policy_serving_teacher_seconds_count".into(),
                    labels: vec![],
                },
            ]
        );
        assert_eq!(q.grouping, vec!["reason".to_owned()]);
        assert_eq!(q.functions, vec!["sum", "rate", "sum", "rate"]);
    }

    #[test]
    fn strings_and_subqueries_name_nothing() {
        let q = parse(r#"deriv(max(m{a="b{c}"})[15m:1m]) > 0.5 and m2 or vector(0)"#).unwrap();
        let names: Vec<_> = q.selectors.iter().map(|s| s.metric.as_str()).collect();
        assert_eq!(names, vec!["m", "m2"]);
    }

    #[test]
    fn malformed_expressions_are_errors() {
        assert!(matches!(
            parse(r#"{__name__="x"}"#),
            Err(ParseError::NamelessSelector { .. })
        ));
        assert!(matches!(
            parse(r#"m{a="b}"#),
            Err(ParseError::Unterminated { .. })
        ));
        assert!(matches!(
            parse("rate(m[5m)"),
            Err(ParseError::Unterminated { .. })
        ));
    }
}

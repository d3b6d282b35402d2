//! Reads the workspace's own Rust source for what it records: every `counter!`, `gauge!` and
//! `histogram!` call, the constant it names and the label keys it passes. The check of the deploy
//! files trusts the catalogue's labels; this keeps them true to the code.

use std::path::{Path, PathBuf};

use ps_core::metric_names::MetricKind;

/// One call of a metrics macro.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// `file:line`.
    pub place: String,
    pub kind: MetricKind,
    /// The constant's name as written (last path segment), for example `TURNS_DROPPED_TOTAL`.
    pub constant: String,
    pub labels: Vec<String>,
}

/// The `pub const NAME: &str = "value";` pairs of a catalogue file.
pub fn constants(catalogue_source: &str) -> Vec<(String, String)> {
    let Ok(re) = regex::Regex::new(r#"pub const ([A-Z0-9_]+): &str =\s*"([^"]+)";"#) else {
        return Vec::new();
    };
    re.captures_iter(catalogue_source)
        .map(|c| (c[1].to_owned(), c[2].to_owned()))
        .collect()
}

/// Every metrics macro call in `source` (a file's text); `file` names it in `place`.
pub fn recorded(file: &str, source: &str) -> Vec<Recorded> {
    let Ok(call) = regex::Regex::new(r"\b(counter|gauge|histogram)!\s*\(") else {
        return Vec::new();
    };
    let Ok(label) = regex::Regex::new(r#""([A-Za-z_][A-Za-z0-9_]*)"\s*=>"#) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for m in call.captures_iter(source) {
        let Some(whole) = m.get(0) else { continue };
        let kind = match &m[1] {
            "counter" => MetricKind::Counter,
            "gauge" => MetricKind::Gauge,
            _ => MetricKind::Histogram,
        };
        // The macro's arguments: up to the parenthesis that closes it.
        let rest = &source[whole.end()..];
        let mut depth = 1usize;
        let mut end = rest.len();
        for (i, c) in rest.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i;
                        break;
                    }
                }
                _ => {}
            }
        }
        let args = &rest[..end];
        let first = args.split(',').next().unwrap_or("").trim();
        let constant = first.rsplit("::").next().unwrap_or(first).trim().to_owned();
        let line = source[..whole.start()].matches('\n').count() + 1;
        out.push(Recorded {
            place: format!("{file}:{line}"),
            kind,
            constant,
            labels: label.captures_iter(args).map(|c| c[1].to_owned()).collect(),
        });
    }
    out
}

/// Every `.rs` file under `dir`, skipping `target` and hidden directories.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name();
            let name = name.to_string_lossy();
            if p.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    stack.push(p);
                }
            } else if name.ends_with(".rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_constants_and_labels_are_read() {
        let src = r#"
fn f() {
    metrics::counter!(m::REQUESTS_TOTAL, "turn_type" => t.as_str(), "outcome" => "ok",
        "status" => s.to_string()).increment(1);
    histogram!(PROVIDER_SECONDS).record(x.elapsed().as_secs_f64());
    metrics::gauge!(ps_core::metric_names::PENDING_TURNS, "state" => state).set(1.0);
}
"#;
        let r = recorded("a.rs", src);
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].constant, "REQUESTS_TOTAL");
        assert_eq!(r[0].labels, vec!["turn_type", "outcome", "status"]);
        assert_eq!(r[0].place, "a.rs:3");
        assert_eq!(r[1].kind, MetricKind::Histogram);
        assert_eq!(r[1].constant, "PROVIDER_SECONDS");
        assert!(r[1].labels.is_empty());
        assert_eq!(r[2].constant, "PENDING_TURNS");
        assert_eq!(r[2].kind, MetricKind::Gauge);
    }

    #[test]
    fn multi_line_constants_are_read() {
        let c =
            constants("pub const A: &str = \"a_total\";\npub const B: &str =\n    \"b_total\";\n");
        assert_eq!(
            c,
            vec![
                ("A".into(), "a_total".into()),
                ("B".into(), "b_total".into())
            ]
        );
    }
}

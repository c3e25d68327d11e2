//! `fjord report RESULT.json... --output DIR`: puts bench results side by side
//! in an HTML page and a Markdown summary, with SVG charts ([`charts`]):
//! latency percentile curves (log-scale x from p50 to p99.99), throughput and
//! p99 over time, a table of aggregates with ratios against the first result,
//! and each result's workload and environment (CPU, kernel, commit).
//!
//! Reads the JSON written by `fjord bench` ([`crate::bench::result`]); a
//! missing key reads as "no data" so results of older bench versions still
//! render. Single-threaded, no shared state.

pub mod charts;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Errors of `fjord report`.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a bench result: {reason}")]
    BadResult { path: String, reason: String },
    #[error("chart {name}: {reason}")]
    Chart { name: String, reason: String },
    #[error("no result files given")]
    NoResults,
}

/// `fjord report`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// Result files written by `fjord bench --output`.
    #[arg(required = true)]
    pub results: Vec<PathBuf>,
    /// Directory for index.html, report.md and the SVG charts.
    #[arg(long, short = 'o')]
    pub output: PathBuf,
    /// Title of the report.
    #[arg(long, default_value = "fjord bench report")]
    pub title: String,
    /// Free text (Markdown) put under the title of both outputs, e.g. the commands that produced the results.
    #[arg(long)]
    pub notes: Option<PathBuf>,
}

/// One loaded result.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub path: PathBuf,
    pub json: Value,
    /// 1-based position on the command line (names repeated runs apart).
    pub index: usize,
}

impl Loaded {
    pub fn load(path: &Path) -> Result<Self, ReportError> {
        let text = std::fs::read_to_string(path).map_err(|source| ReportError::Io {
            what: format!("reading {}", path.display()),
            source,
        })?;
        let json: Value = serde_json::from_str(&text).map_err(|e| ReportError::BadResult {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        if json.get("workload").is_none() || json.get("aggregatedPublishLatency50pct").is_none() {
            return Err(ReportError::BadResult {
                path: path.display().to_string(),
                reason: "missing workload / aggregatedPublishLatency50pct".to_string(),
            });
        }
        Ok(Loaded {
            path: path.to_path_buf(),
            json,
            index: 0,
        })
    }

    /// `#index driver (workload)`, the name of a result in charts and tables.
    pub fn name(&self) -> String {
        format!(
            "#{} {} ({})",
            self.index,
            self.str("driver"),
            self.str("workload")
        )
    }

    pub fn str(&self, key: &str) -> String {
        match self.json.get(key) {
            Some(Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
            None => "?".to_string(),
        }
    }

    pub fn num(&self, key: &str) -> Option<f64> {
        self.json.get(key).and_then(Value::as_f64)
    }

    pub fn path_num(&self, path: &[&str]) -> Option<f64> {
        let mut v = &self.json;
        for k in path {
            v = v.get(k)?;
        }
        v.as_f64()
    }

    pub fn path_str(&self, path: &[&str]) -> String {
        let mut v = &self.json;
        for k in path {
            match v.get(k) {
                Some(x) => v = x,
                None => return "?".to_string(),
            }
        }
        match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        }
    }

    pub fn series(&self, key: &str) -> Vec<f64> {
        self.json
            .get(key)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default()
    }

    /// `(percentile, value)` of an `aggregated*Quantiles` map, sorted by percentile.
    pub fn quantiles(&self, key: &str) -> Vec<(f64, f64)> {
        let mut out: Vec<(f64, f64)> = self
            .json
            .get(key)
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.parse::<f64>().ok()?, v.as_f64()?)))
                    .collect()
            })
            .unwrap_or_default();
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        out
    }
}

/// One row of the aggregate table: label, how to read it, whether lower is better.
struct Column {
    title: &'static str,
    get: fn(&Loaded) -> Option<f64>,
}

fn columns() -> Vec<Column> {
    vec![
        Column {
            title: "publish msg/s",
            get: |l| l.path_num(&["totals", "publishRateAvg"]),
        },
        Column {
            title: "publish MB/s",
            get: |l| l.path_num(&["totals", "publishMBps"]),
        },
        Column {
            title: "pub p50 ms",
            get: |l| l.num("aggregatedPublishLatency50pct"),
        },
        Column {
            title: "pub p99 ms",
            get: |l| l.num("aggregatedPublishLatency99pct"),
        },
        Column {
            title: "pub p99.9 ms",
            get: |l| l.num("aggregatedPublishLatency999pct"),
        },
        Column {
            title: "pub p99.99 ms",
            get: |l| l.num("aggregatedPublishLatency9999pct"),
        },
        Column {
            title: "pub max ms",
            get: |l| l.num("aggregatedPublishLatencyMax"),
        },
        Column {
            title: "e2e p50 ms",
            get: |l| nonzero(l.num("aggregatedEndToEndLatency50pct")),
        },
        Column {
            title: "e2e p99 ms",
            get: |l| nonzero(l.num("aggregatedEndToEndLatency99pct")),
        },
        Column {
            title: "e2e p99.9 ms",
            get: |l| nonzero(l.num("aggregatedEndToEndLatency999pct")),
        },
        Column {
            title: "delay p99 µs",
            get: |l| l.num("aggregatedPublishDelayLatency99pct"),
        },
        Column {
            title: "broker CPU s",
            get: |l| l.path_num(&["broker", "cpuSeconds"]),
        },
        Column {
            title: "broker CPU s/GB",
            get: |l| l.path_num(&["broker", "cpuSecondsPerGB"]),
        },
        Column {
            title: "broker peak RSS MiB",
            get: |l| {
                l.path_num(&["broker", "peakRssBytes"])
                    .map(|b| b / (1024.0 * 1024.0))
            },
        },
    ]
}

fn nonzero(v: Option<f64>) -> Option<f64> {
    v.filter(|x| *x > 0.0)
}

fn fmt_num(v: f64) -> String {
    if v >= 1000.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

/// Table cells: value, then `(×ratio)` against the first result's value.
fn table_rows(results: &[Loaded]) -> (Vec<String>, Vec<Vec<String>>) {
    let cols = columns();
    let mut header = vec!["result".to_string()];
    header.extend(cols.iter().map(|c| c.title.to_string()));
    let rows = results
        .iter()
        .map(|r| {
            let mut row = vec![r.name()];
            for c in &cols {
                let v = (c.get)(r);
                let base = (c.get)(&results[0]);
                row.push(match (v, base) {
                    (Some(v), Some(b)) if b > 0.0 && !std::ptr::eq(r, &results[0]) => {
                        format!("{} (×{:.2})", fmt_num(v), v / b)
                    }
                    (Some(v), _) => fmt_num(v),
                    (None, _) => "–".to_string(),
                });
            }
            row
        })
        .collect();
    (header, rows)
}

fn describe(r: &Loaded) -> Vec<(String, String)> {
    let c = |k: &str| r.path_str(&["config", k]);
    let e = |k: &str| r.path_str(&["environment", k]);
    vec![
        ("file".into(), r.path.display().to_string()),
        (
            "workload".into(),
            format!(
                "{}: {} B messages, {} partitions, {} producers, {} consumers, rate {} msg/s, duration {} s (warm-up {} s)",
                r.str("workload"),
                c("message_size"),
                c("partitions"),
                c("producers"),
                c("consumers"),
                c("rate"),
                c("duration"),
                c("warmup")
            ),
        ),
        (
            "producer".into(),
            format!(
                "acks={} linger.ms={} batch.size={} compression={} keys={} idempotence={} transaction-duration-ms={}",
                c("acks"),
                c("linger_ms"),
                c("batch_size"),
                c("compression"),
                c("keys"),
                c("idempotence"),
                c("transaction_duration_ms")
            ),
        ),
        ("bootstrap".into(), c("bootstrap")),
        (
            "environment".into(),
            format!(
                "{} ({} CPUs online), kernel {}, host {}, commit {}",
                e("cpuModel"),
                e("cpusOnline"),
                e("kernel"),
                e("hostname"),
                e("commit")
            ),
        ),
        (
            "totals".into(),
            format!(
                "sent {}, acked {}, errors {}, consumed {}, drained {}",
                r.path_str(&["totals", "sent"]),
                r.path_str(&["totals", "acked"]),
                r.path_str(&["totals", "errors"]),
                r.path_str(&["totals", "consumed"]),
                r.path_str(&["totals", "drained"])
            ),
        ),
    ]
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Runs `fjord report`.
pub fn run(args: ReportArgs) -> Result<(), ReportError> {
    if args.results.is_empty() {
        return Err(ReportError::NoResults);
    }
    let results = args
        .results
        .iter()
        .enumerate()
        .map(|(i, p)| {
            Loaded::load(p).map(|mut l| {
                l.index = i + 1;
                l
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    std::fs::create_dir_all(&args.output).map_err(|source| ReportError::Io {
        what: format!("creating {}", args.output.display()),
        source,
    })?;
    let notes = match &args.notes {
        Some(p) => std::fs::read_to_string(p).map_err(|source| ReportError::Io {
            what: format!("reading {}", p.display()),
            source,
        })?,
        None => String::new(),
    };
    let figures = charts::draw_all(&results, &args.output)?;
    let (header, rows) = table_rows(&results);

    let mut md = String::new();
    let _ = writeln!(md, "# {}\n", args.title);
    if !notes.is_empty() {
        let _ = writeln!(md, "{}\n", notes.trim_end());
    }
    let _ = writeln!(md, "## Aggregates (ratios against the first result)\n");
    let _ = writeln!(md, "| {} |", header.join(" | "));
    let _ = writeln!(md, "|{}", "---|".repeat(header.len()));
    for row in &rows {
        let _ = writeln!(md, "| {} |", row.join(" | "));
    }
    let _ = writeln!(md, "\n## Charts\n");
    for f in &figures {
        let _ = writeln!(md, "### {}\n\n![{}]({})\n", f.title, f.title, f.file);
    }
    let _ = writeln!(md, "## Results\n");
    for r in &results {
        let _ = writeln!(md, "### {}\n", r.name());
        for (k, v) in describe(r) {
            let _ = writeln!(md, "- {k}: {v}");
        }
        let _ = writeln!(md);
    }

    let mut html = String::new();
    let _ = writeln!(
        html,
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{t}</title>\n<style>body{{font-family:sans-serif;max-width:1200px;margin:auto}}table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}td:first-child{{text-align:left}}pre{{background:#f6f6f6;padding:8px;white-space:pre-wrap}}</style></head><body>\n<h1>{t}</h1>",
        t = html_escape(&args.title)
    );
    if !notes.is_empty() {
        let _ = writeln!(html, "<pre>{}</pre>", html_escape(notes.trim_end()));
    }
    let _ = writeln!(
        html,
        "<h2>Aggregates (ratios against the first result)</h2>\n<table><tr>{}</tr>",
        header
            .iter()
            .map(|h| format!("<th>{}</th>", html_escape(h)))
            .collect::<String>()
    );
    for row in &rows {
        let _ = writeln!(
            html,
            "<tr>{}</tr>",
            row.iter()
                .map(|c| format!("<td>{}</td>", html_escape(c)))
                .collect::<String>()
        );
    }
    let _ = writeln!(html, "</table>\n<h2>Charts</h2>");
    for f in &figures {
        let _ = writeln!(
            html,
            "<h3>{}</h3>\n<img src=\"{}\" alt=\"{}\">",
            html_escape(&f.title),
            f.file,
            html_escape(&f.title)
        );
    }
    let _ = writeln!(html, "<h2>Results</h2>");
    for r in &results {
        let _ = writeln!(html, "<h3>{}</h3>\n<ul>", html_escape(&r.name()));
        for (k, v) in describe(r) {
            let _ = writeln!(
                html,
                "<li><b>{}</b>: {}</li>",
                html_escape(&k),
                html_escape(&v)
            );
        }
        let _ = writeln!(html, "</ul>");
    }
    let _ = writeln!(html, "</body></html>");

    for (name, text) in [("report.md", md), ("index.html", html)] {
        let p = args.output.join(name);
        std::fs::write(&p, text).map_err(|source| ReportError::Io {
            what: format!("writing {}", p.display()),
            source,
        })?;
    }
    println!(
        "fjord report: index.html and report.md in {}",
        args.output.display()
    );
    Ok(())
}

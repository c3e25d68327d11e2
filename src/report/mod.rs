//! `fjord report RESULT.json... --output DIR`: puts bench results side by side
//! in an HTML page and a Markdown summary, with SVG charts ([`charts`]):
//! a one-paragraph verdict first (who is faster at what, by how much, under
//! which workload, on which machine), then a table of aggregates with one
//! row per broker and workload (repeated runs as median, min and max) and
//! ratios in words ("3.2× slower"), latency percentile curves (log-scale x
//! from p50 to p99.99), throughput and p99 over time, and each result's
//! workload and environment (CPU, kernel, commit). The page uses the
//! window's width; `tests/report_browser.rs` renders it in headless Chromium.
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

/// Results of the same broker (`driver`) and workload: repeated runs (what
/// `compare.sh` makes) are one row of the table, one colour in the charts.
pub struct Group<'a> {
    /// `driver (workload)`.
    pub name: String,
    pub driver: String,
    pub workload: String,
    pub runs: Vec<&'a Loaded>,
}

/// Groups `results` by driver and workload, in order of first appearance.
pub fn group(results: &[Loaded]) -> Vec<Group<'_>> {
    let mut groups: Vec<Group<'_>> = Vec::new();
    for r in results {
        let (driver, workload) = (r.str("driver"), r.str("workload"));
        match groups
            .iter_mut()
            .find(|g| g.driver == driver && g.workload == workload)
        {
            Some(g) => g.runs.push(r),
            None => groups.push(Group {
                name: format!("{driver} ({workload})"),
                driver,
                workload,
                runs: vec![r],
            }),
        }
    }
    groups
}

/// Which way a column is better, and the words for a ratio against the
/// baseline.
#[derive(Clone, Copy)]
enum Better {
    /// Throughput: more is faster.
    Higher,
    /// Latency: more is slower.
    Lower,
    /// Resources (CPU, memory): more is more.
    Less,
}

/// One column of the aggregate table.
struct Column {
    title: &'static str,
    get: fn(&Loaded) -> Option<f64>,
    better: Better,
}

fn columns() -> Vec<Column> {
    use Better::{Higher, Less, Lower};
    vec![
        Column {
            title: "publish msg/s",
            get: |l| l.path_num(&["totals", "publishRateAvg"]),
            better: Higher,
        },
        Column {
            title: "publish MB/s",
            get: |l| l.path_num(&["totals", "publishMBps"]),
            better: Higher,
        },
        Column {
            title: "pub p50 ms",
            get: |l| l.num("aggregatedPublishLatency50pct"),
            better: Lower,
        },
        Column {
            title: "pub p99 ms",
            get: |l| l.num("aggregatedPublishLatency99pct"),
            better: Lower,
        },
        Column {
            title: "pub p99.9 ms",
            get: |l| l.num("aggregatedPublishLatency999pct"),
            better: Lower,
        },
        Column {
            title: "pub p99.99 ms",
            get: |l| l.num("aggregatedPublishLatency9999pct"),
            better: Lower,
        },
        Column {
            title: "pub max ms",
            get: |l| l.num("aggregatedPublishLatencyMax"),
            better: Lower,
        },
        Column {
            title: "e2e p50 ms",
            get: |l| nonzero(l.num("aggregatedEndToEndLatency50pct")),
            better: Lower,
        },
        Column {
            title: "e2e p99 ms",
            get: |l| nonzero(l.num("aggregatedEndToEndLatency99pct")),
            better: Lower,
        },
        Column {
            title: "e2e p99.9 ms",
            get: |l| nonzero(l.num("aggregatedEndToEndLatency999pct")),
            better: Lower,
        },
        Column {
            title: "delay p99 µs",
            get: |l| l.num("aggregatedPublishDelayLatency99pct"),
            better: Lower,
        },
        Column {
            title: "broker CPU s",
            get: |l| l.path_num(&["broker", "cpuSeconds"]),
            better: Less,
        },
        Column {
            title: "broker CPU s/GB",
            get: |l| l.path_num(&["broker", "cpuSecondsPerGB"]),
            better: Less,
        },
        Column {
            title: "broker peak RSS MiB",
            get: |l| {
                l.path_num(&["broker", "peakRssBytes"])
                    .map(|b| b / (1024.0 * 1024.0))
            },
            better: Less,
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

/// Min, median and max of a group's runs for one column (runs without the
/// value left out); `None` if no run has it.
fn spread(values: impl Iterator<Item = Option<f64>>) -> Option<(f64, f64, f64)> {
    let mut v: Vec<f64> = values.flatten().collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some((v[0], median, v[n - 1]))
}

/// Ratios within this much of 1 read as "same".
const SAME_RATIO_MAX: f64 = 1.03;

/// `value` against `base` in words a reader does not have to work out:
/// "3.2× slower", "1.8× faster", "2.0× less", "same".
fn ratio_words(value: f64, base: f64, better: Better) -> String {
    if value <= 0.0 || base <= 0.0 {
        return String::new();
    }
    let (r, up) = if value >= base {
        (value / base, true)
    } else {
        (base / value, false)
    };
    if r < SAME_RATIO_MAX {
        return "same".to_string();
    }
    let word = match (better, up) {
        (Better::Higher, true) | (Better::Lower, false) => "faster",
        (Better::Higher, false) | (Better::Lower, true) => "slower",
        (Better::Less, true) => "more",
        (Better::Less, false) => "less",
    };
    let n = if r >= 100.0 {
        format!("{r:.0}")
    } else {
        format!("{r:.1}")
    };
    format!("{n}× {word}")
}

/// The aggregate table: one row per group, cells "median (min–max)" over
/// its runs, and under each value its ratio against the first group's
/// median in words.
fn table_rows(groups: &[Group<'_>]) -> (Vec<String>, Vec<Vec<String>>) {
    let cols = columns();
    let mut header = vec!["broker (workload)".to_string(), "runs".to_string()];
    header.extend(cols.iter().map(|c| c.title.to_string()));
    let rows = groups
        .iter()
        .enumerate()
        .map(|(gi, g)| {
            let mut row = vec![g.name.clone(), g.runs.len().to_string()];
            for c in &cols {
                let here = spread(g.runs.iter().map(|r| (c.get)(r)));
                let base = spread(groups[0].runs.iter().map(|r| (c.get)(r)));
                let mut cell = match here {
                    Some((lo, med, hi)) if g.runs.len() > 1 => {
                        format!("{} ({}–{})", fmt_num(med), fmt_num(lo), fmt_num(hi))
                    }
                    Some((_, med, _)) => fmt_num(med),
                    None => "–".to_string(),
                };
                if let (Some((_, v, _)), Some((_, b, _)), true) = (here, base, gi > 0) {
                    let words = ratio_words(v, b, c.better);
                    if !words.is_empty() {
                        cell.push_str(&format!(" · {words}"));
                    }
                }
                row.push(cell);
            }
            row
        })
        .collect();
    (header, rows)
}

/// The report's opening paragraph: for each workload run by more than one
/// broker, how every other broker compares with the first (median
/// throughput and publish latencies), and the machine it ran on.
fn verdict(groups: &[Group<'_>]) -> String {
    let cols = columns();
    let col = |title: &str| cols.iter().find(|c| c.title == title).expect("column");
    let median = |g: &Group<'_>, c: &Column| spread(g.runs.iter().map(|r| (c.get)(r))).map(|s| s.1);
    let mut sentences = Vec::new();
    let mut workloads: Vec<&str> = groups.iter().map(|g| g.workload.as_str()).collect();
    workloads.dedup();
    for w in workloads {
        let of_w: Vec<&Group<'_>> = groups.iter().filter(|g| g.workload == w).collect();
        let base = of_w[0];
        if of_w.len() < 2 {
            let tput = median(base, col("publish msg/s")).map(fmt_num);
            let p99 = median(base, col("pub p99 ms")).map(fmt_num);
            sentences.push(format!(
                "Under {w}, {} ran {} time(s): median {} msg/s published, p99 publish latency {} ms.",
                base.driver,
                base.runs.len(),
                tput.unwrap_or_else(|| "?".into()),
                p99.unwrap_or_else(|| "?".into())
            ));
            continue;
        }
        for g in &of_w[1..] {
            let mut parts = Vec::new();
            for title in [
                "publish msg/s",
                "pub p50 ms",
                "pub p99 ms",
                "pub p99.99 ms",
                "e2e p99 ms",
                "broker CPU s/GB",
            ] {
                let c = col(title);
                if let (Some(v), Some(b)) = (median(g, c), median(base, c)) {
                    let words = ratio_words(v, b, c.better);
                    if !words.is_empty() {
                        parts.push(format!(
                            "{title} {words} ({} vs {})",
                            fmt_num(v),
                            fmt_num(b)
                        ));
                    }
                }
            }
            sentences.push(format!(
                "Under {w} ({} and {} run(s), medians compared), {} against {}: {}.",
                g.runs.len(),
                base.runs.len(),
                g.driver,
                base.driver,
                parts.join(", ")
            ));
        }
    }
    if let Some(r) = groups.first().and_then(|g| g.runs.first()) {
        let e = |k: &str| r.path_str(&["environment", k]);
        sentences.push(format!(
            "Machine: {} with {} CPU(s) online, kernel {}, fjord commit {}.",
            e("cpuModel"),
            e("cpusOnline"),
            e("kernel"),
            e("commit")
        ));
    }
    sentences.join(" ")
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

/// What the table's cells say.
const TABLE_NOTE: &str = "One row per broker and workload. With several runs a cell is the median (min–max) over them; after the · is that median against the first row's median (faster/slower for throughput and latency, more/less for CPU and memory).";

/// The page's style: the whole window's width, 16 px text, charts scaled
/// to the width (SVGs scale without blur), a wide table scrolling on its
/// own instead of squeezing its cells.
const CSS: &str = "body{font-family:sans-serif;font-size:16px;line-height:1.4;margin:0 2vw}\
h1{font-size:28px}h2{font-size:22px;margin-top:1.5em}h3{font-size:18px}\
.verdict{font-size:18px;background:#f3f7fb;border-left:4px solid #1f77b4;padding:10px 14px}\
.scroll{overflow-x:auto}table{border-collapse:collapse;font-size:15px}\
td,th{border:1px solid #ccc;padding:4px 8px;text-align:right;white-space:nowrap}\
td:first-child,th:first-child{text-align:left}th{background:#f3f3f3}\
img.chart{display:block;width:100%;max-width:1800px;height:auto}\
pre{background:#f6f6f6;padding:8px;white-space:pre-wrap}";

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
    let groups = group(&results);
    let figures = charts::draw_all(&groups, &args.output)?;
    let (header, rows) = table_rows(&groups);
    let verdict = verdict(&groups);

    let mut md = String::new();
    let _ = writeln!(md, "# {}\n", args.title);
    let _ = writeln!(md, "**Verdict.** {verdict}\n");
    if !notes.is_empty() {
        let _ = writeln!(md, "{}\n", notes.trim_end());
    }
    let _ = writeln!(md, "## Aggregates\n\n{TABLE_NOTE}\n");
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
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\"><title>{t}</title>\n<style>{CSS}</style></head><body>\n<h1>{t}</h1>\n<p class=\"verdict\"><b>Verdict.</b> {v}</p>",
        t = html_escape(&args.title),
        v = html_escape(&verdict)
    );
    if !notes.is_empty() {
        let _ = writeln!(html, "<pre>{}</pre>", html_escape(notes.trim_end()));
    }
    let _ = writeln!(
        html,
        "<h2>Aggregates</h2>\n<p>{}</p>\n<div class=\"scroll\"><table><tr>{}</tr>",
        html_escape(TABLE_NOTE),
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
    let _ = writeln!(html, "</table></div>\n<h2>Charts</h2>");
    for f in &figures {
        let _ = writeln!(
            html,
            "<h3>{}</h3>\n<img class=\"chart\" src=\"{}\" alt=\"{}\">",
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

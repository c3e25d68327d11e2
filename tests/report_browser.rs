//! `fjord report`'s page as a person sees it: the report of six real bench
//! results (three fjord and three Kafka runs of one workload, committed in
//! tuning/results) opened in headless Chromium (Debian's `chromium`,
//! installed by `.ci/run`). Checks the page's text (a verdict first, one
//! table row per broker with min/median/max, ratios in words), then in the
//! browser that every chart loaded and spans the page's width with nothing
//! overflowing sideways, and takes a screenshot.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Results of `tuning/results/fjord-vs-kafka/2026-12-02`: latency, 100 B at
/// 10k msg/s, three alternating runs per broker.
const RESULTS_DIR: &str = "tuning/results/fjord-vs-kafka/2026-12-02";
/// The window the page is rendered in, in CSS pixels.
const WINDOW_WIDTH_PX: u32 = 1400;
const WINDOW_HEIGHT_PX: u32 = 5200;
/// A chart narrower than this share of the window is not using the page.
const CHART_WIDTH_SHARE_MIN: f64 = 0.8;
/// How long Chromium may run the page (virtual time), in ms.
const VIRTUAL_TIME_BUDGET_MS: u32 = 10_000;

fn results() -> Vec<PathBuf> {
    // Relative to the repository (the report names each file it read).
    let dir = Path::new(RESULTS_DIR);
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(dir))
            .expect("results dir")
            .map(|e| dir.join(e.expect("entry").file_name()))
            .filter(|p| {
                let name = p
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned();
                name.starts_with("latency-100b-10k-") && name.ends_with(".json")
            })
            .collect();
    files.sort();
    assert_eq!(files.len(), 6, "three fjord and three Kafka results");
    files
}

/// Renders the report of the six results into `out`.
pub fn render(out: &Path) {
    let status = Command::new(env!("CARGO_BIN_EXE_fjord"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("report")
        .args(results())
        .arg("--output")
        .arg(out)
        .args(["--title", "fjord vs Kafka 4.4: latency, 100 B at 10k msg/s"])
        .status()
        .expect("fjord report");
    assert!(status.success());
}

fn chromium(args: &[&str]) -> std::process::Output {
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
        ])
        .arg(format!(
            "--window-size={WINDOW_WIDTH_PX},{WINDOW_HEIGHT_PX}"
        ))
        .arg(format!("--virtual-time-budget={VIRTUAL_TIME_BUDGET_MS}"))
        .args(args)
        .output()
        .expect("chromium (Debian package chromium, installed by .ci/run)");
    assert!(
        out.status.success(),
        "chromium {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A page that loads the report in a frame of the window's width and
/// writes what it finds into `<pre id="out">`, read back with --dump-dom.
const HARNESS: &str = r#"<!DOCTYPE html><html><body style="margin:0"><pre id="out">not loaded</pre>
<iframe id="f" src="index.html" style="border:0;width:WIDTHpx;height:3000px"></iframe>
<script>
const f = document.getElementById('f');
f.onload = () => {
  const d = f.contentDocument;
  const frame = d.documentElement.clientWidth;
  const imgs = [...d.querySelectorAll('img')];
  const bad = imgs.filter(i => !(i.complete && i.naturalWidth > 0
      && i.getBoundingClientRect().width >= SHARE * frame));
  document.getElementById('out').textContent = 'charts=' + imgs.length
      + ' bad=' + bad.map(i => i.getAttribute('src')).join(',')
      + ' overflow=' + (d.documentElement.scrollWidth - frame);
};
</script></body></html>"#;

#[test]
fn report_renders_in_chromium_with_every_chart_visible_at_full_width() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("report");
    render(&out);

    let html = std::fs::read_to_string(out.join("index.html")).expect("index.html");
    let verdict = html.find("<b>Verdict.</b>").expect("a verdict");
    let table = html.find("<table>").expect("a table");
    assert!(verdict < table, "the verdict comes first");
    assert!(
        html.contains("kafka against fjord") || html.contains("fjord against kafka"),
        "the verdict compares the brokers"
    );
    let rows = html.matches("<tr>").count() - 1;
    assert_eq!(rows, 2, "one row per broker, not per run");
    assert!(html.contains("<td>3</td>"), "each row says it holds 3 runs");
    assert!(
        html.contains('–') && html.contains(" · "),
        "median (min–max) and a ratio"
    );
    assert!(
        html.contains("× slower") || html.contains("× faster"),
        "ratios in words"
    );
    assert!(!html.contains("(×"), "no bare ×ratio columns");

    std::fs::write(
        out.join("harness.html"),
        HARNESS
            .replace("WIDTH", &WINDOW_WIDTH_PX.to_string())
            .replace("SHARE", &CHART_WIDTH_SHARE_MIN.to_string()),
    )
    .expect("write harness");
    let dom = chromium(&[
        "--allow-file-access-from-files",
        "--dump-dom",
        &format!("file://{}", out.join("harness.html").display()),
    ]);
    let dom = String::from_utf8_lossy(&dom.stdout);
    let found = dom
        .split("<pre id=\"out\">")
        .nth(1)
        .and_then(|s| s.split('<').next())
        .expect("the harness's output");
    assert_eq!(
        found, "charts=6 bad= overflow=0",
        "every chart loads and spans the page, nothing overflows sideways"
    );

    let png = out.join("screenshot.png");
    chromium(&[
        &format!("--screenshot={}", png.display()),
        &format!("file://{}", out.join("index.html").display()),
    ]);
    let bytes = std::fs::read(&png).expect("the screenshot");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
    let width = u32::from_be_bytes(bytes[16..20].try_into().expect("IHDR width"));
    assert_eq!(
        width, WINDOW_WIDTH_PX,
        "screenshot of the whole window width"
    );
    if let Some(keep) = std::env::var_os("FJORD_REPORT_SCREENSHOT_DIR") {
        // Used to refresh the committed report and screenshot in tuning/results.
        let keep = PathBuf::from(keep);
        std::fs::create_dir_all(&keep).expect("create the keep dir");
        for e in std::fs::read_dir(&out).expect("report dir") {
            let p = e.expect("entry").path();
            if p.file_name().is_some_and(|n| n != "harness.html") {
                std::fs::copy(&p, keep.join(p.file_name().expect("name"))).expect("copy");
            }
        }
    }
}

//! `cachalot view` pages opened in headless Chromium: the page must draw one band
//! per allocation of the replayed trace, and a screenshot is kept for people to
//! look at (under `target/tmp/view-screenshots/`).
//!
//! Skips, saying so, when no Chromium is installed (`.ci/run` installs it).

use std::path::{Path, PathBuf};
use std::process::Command;

use cachalot::event::Action;
use cachalot::trace::{read_recording_path, ReadLimits};

fn chromium() -> Option<PathBuf> {
    let candidates = [
        std::env::var("CHROMIUM").unwrap_or_default(),
        "chromium".into(),
        "chromium-browser".into(),
    ];
    candidates
        .into_iter()
        .filter(|c| !c.is_empty())
        .map(PathBuf::from)
        .find(|c| {
            Command::new(c)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn out_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("view-screenshots");
    std::fs::create_dir_all(&dir).expect("can create the output directory");
    dir
}

fn browser(chromium: &Path, profile: &Path) -> Command {
    let mut c = Command::new(chromium);
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
    ]);
    c.arg(format!("--user-data-dir={}", profile.display()));
    c
}

/// The integer value of `name="..."` in the dumped DOM.
fn attribute(dom: &str, name: &str) -> Option<u64> {
    let start = dom.find(&format!("{name}=\""))? + name.len() + 2;
    dom[start..].split('"').next()?.parse().ok()
}

/// Renders `trace` with `cachalot view`, opens it, checks the drawn allocations
/// and saves a screenshot; returns the dumped DOM.
fn check_page(chromium: &Path, trace: &Path, name: &str, extra: &[&str]) -> String {
    let out = out_dir();
    let page = out.join(format!("{name}.html"));
    let status = Command::new(env!("CARGO_BIN_EXE_cachalot"))
        .arg("view")
        .arg(trace)
        .args(extra)
        .arg("-o")
        .arg(&page)
        .status()
        .expect("cachalot runs");
    assert!(status.success(), "cachalot view {} failed", trace.display());

    let recording = read_recording_path(trace, &ReadLimits::default()).expect("the trace reads");
    let allocs = recording
        .events
        .iter()
        .filter(|e| e.action == Action::Alloc)
        .count() as u64;

    let profile = tempfile::tempdir().expect("a profile directory");
    let url = format!(
        "file://{}",
        page.canonicalize().expect("page exists").display()
    );
    let dom = browser(chromium, profile.path())
        .arg("--dump-dom")
        .arg(&url)
        .output()
        .expect("chromium runs");
    let dom = String::from_utf8_lossy(&dom.stdout).into_owned();
    assert_eq!(
        attribute(&dom, "data-drawn-allocations"),
        Some(allocs),
        "{name}: every allocation drawn"
    );
    assert!(
        attribute(&dom, "data-drawn-segments").is_some_and(|n| n > 0),
        "{name}: the segment map drew"
    );
    assert!(
        attribute(&dom, "data-peak-allocations").is_some_and(|n| n > 0),
        "{name}: the peak table filled"
    );
    let ms = attribute(&dom, "data-render-ms").expect("the page timed itself");
    eprintln!("{name}: {allocs} allocations drawn in {ms} ms");

    let shot = out.join(format!("{name}.png"));
    let _ = std::fs::remove_file(&shot);
    let status = browser(chromium, profile.path())
        .arg(format!("--screenshot={}", shot.display()))
        .arg("--window-size=1400,900")
        .arg(&url)
        .output()
        .expect("chromium runs")
        .status;
    assert!(status.success(), "{name}: screenshot taken");
    let size = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
    assert!(
        size > 20_000,
        "{name}: the screenshot has content ({size} bytes)"
    );
    eprintln!("{name}: screenshot at {}", shot.display());
    dom
}

#[test]
fn largest_trace_draws_every_allocation() {
    let Some(chromium) = chromium() else {
        eprintln!(
            "SKIPPED: no chromium on PATH (apt-get install -y chromium); the page was not opened"
        );
        return;
    };
    let dom = check_page(
        &chromium,
        &repo().join("data/traces/bert_dynamic.native.trace.csv.gz"),
        "bert_dynamic",
        &[],
    );
    let ms = attribute(&dom, "data-render-ms").expect("timed");
    assert!(ms < 5_000, "drawing the largest trace stays quick: {ms} ms");

    // Hovering a band shows that allocation's details; "#t=" moves the map.
    let page = out_dir()
        .join("bert_dynamic.html")
        .canonicalize()
        .expect("page exists");
    let url = format!("file://{}#hover=800,330&t=20000", page.display());
    let profile = tempfile::tempdir().expect("a profile directory");
    let out = browser(&chromium, profile.path())
        .args(["--window-size=1400,900", "--dump-dom"])
        .arg(&url)
        .output()
        .expect("chromium runs");
    let dom = String::from_utf8_lossy(&out.stdout);
    let tip = dom.split("id=\"tip\"").nth(1).expect("the tooltip element");
    let head: String = tip.chars().take(200).collect();
    assert!(
        tip.contains("display: block") && head.contains("allocation #"),
        "hover details shown: {head}"
    );
    assert!(
        dom.contains("event 20000 of 25241"),
        "the map moved to event 20000"
    );
    let shot = out_dir().join("bert_dynamic_hover.png");
    browser(&chromium, profile.path())
        .arg(format!("--screenshot={}", shot.display()))
        .arg("--window-size=1400,900")
        .arg(&url)
        .output()
        .expect("chromium runs");
    eprintln!("bert_dynamic: hover screenshot at {}", shot.display());
}

#[test]
fn snapshot_pickle_and_expandable_segments_draw() {
    let Some(chromium) = chromium() else {
        eprintln!(
            "SKIPPED: no chromium on PATH (apt-get install -y chromium); the page was not opened"
        );
        return;
    };
    check_page(
        &chromium,
        &repo().join("data/traces/seed002.native.snapshot.pickle.gz"),
        "seed002_snapshot",
        &[],
    );
    let gpt2 = repo().join("data/traces/gpt2_train.expandable.trace.csv.gz");
    check_page(
        &chromium,
        &gpt2,
        "gpt2_train_expandable",
        &["--conf", "expandable_segments:True"],
    );
}

//! `cachalot view` pages opened in headless Chromium: the page must draw one band
//! per allocation of the replayed trace, and a screenshot is kept for people to
//! look at (under `target/tmp/view-screenshots/`).
//!
//! Skips, saying so, when no Chromium is installed (`.ci/run` installs it).

use cachalot_testkit::cli::repo;
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
    let status = cachalot_testkit::cli::cachalot()
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
        tip.contains("display: block") && head.contains("allocation 0x"),
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

/// A training-like trace of `events` events: rounds of a hundred activations
/// (one in ten on a side stream), each with a short-lived temporary, freed in
/// reverse order.
fn synthetic_trace(path: &Path, events: usize) {
    use std::io::Write;
    let file = std::fs::File::create(path).expect("can write the trace");
    let mut out = std::io::BufWriter::new(file);
    writeln!(out, "time_us,action,addr,size,stream").expect("writes");
    let sizes = [512u64, 4096, 1 << 20, 3 << 20, 16 << 20, 48 << 20, 96 << 20];
    let mut seed = 7u64;
    let mut next = move |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    let (mut addr, mut time, mut written) = (1u64 << 40, 1_700_000_000_000_000u64, 0);
    while written < events {
        let mut activations = Vec::with_capacity(100);
        for _ in 0..100 {
            let size = sizes[next(sizes.len() as u64) as usize];
            let stream = if next(10) == 0 { 7 } else { 0 };
            writeln!(out, "{time},alloc,{addr},{size},{stream}").expect("writes");
            activations.push((addr, size, stream));
            addr += size + 512;
            let temp = sizes[next(3) as usize * 2];
            writeln!(out, "{time},alloc,{addr},{temp},0").expect("writes");
            writeln!(out, "{},free_completed,{addr},{temp},0", time + 1).expect("writes");
            addr += temp + 512;
            time += 3;
            written += 3;
        }
        for (a, size, stream) in activations.into_iter().rev() {
            writeln!(out, "{time},free_completed,{a},{size},{stream}").expect("writes");
            time += 2;
            written += 1;
        }
    }
    out.flush().expect("writes");
}

#[test]
fn a_five_million_event_trace_shows_the_exact_peaks_and_renders_quickly() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let trace = dir.path().join("synthetic.csv");
    synthetic_trace(&trace, 5_000_000);
    let trace = trace.to_str().expect("utf-8 path");
    let replay = cachalot_testkit::cli::cachalot()
        .args(["replay", trace, "--json"])
        .output()
        .expect("cachalot runs");
    assert!(replay.status.success(), "replay runs");
    let replay: serde_json::Value = serde_json::from_slice(&replay.stdout).expect("JSON");
    let requested = replay["peak_requested_bytes"].as_u64().expect("a peak");
    let reserved = replay["peak_reserved_bytes"].as_u64().expect("a peak");
    assert!(reserved > 1 << 30, "the trace holds gigabytes: {reserved}");

    let page = out_dir().join("synthetic_5m.html");
    let view = cachalot_testkit::cli::cachalot()
        .args(["view", trace, "-o"])
        .arg(&page)
        .output()
        .expect("cachalot runs");
    assert!(view.status.success(), "view runs");
    let line = String::from_utf8_lossy(&view.stdout);
    assert!(
        line.contains(&format!("({requested} bytes) at event"))
            && line.contains(&format!("({reserved} bytes)")),
        "view prints replay's peaks: {line}"
    );
    let size = std::fs::metadata(&page).expect("the page").len();
    assert!(size < 16 << 20, "the page stays small: {size} bytes");

    let Some(chromium) = chromium() else {
        eprintln!("SKIPPED: no chromium on PATH; the 5M-event page was not opened");
        return;
    };
    let profile = tempfile::tempdir().expect("a profile directory");
    let url = format!("file://{}", page.canonicalize().expect("page").display());
    let dom = browser(&chromium, profile.path())
        .arg("--dump-dom")
        .arg(&url)
        .output()
        .expect("chromium runs");
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert_eq!(attribute(&dom, "data-peak-active"), Some(requested));
    assert_eq!(attribute(&dom, "data-peak-reserved"), Some(reserved));
    assert_eq!(attribute(&dom, "data-total-allocations"), Some(2_500_000));
    assert!(attribute(&dom, "data-drawn-allocations").is_some_and(|n| n > 1000));
    let ms = attribute(&dom, "data-render-ms").expect("the page timed itself");
    eprintln!("synthetic 5M events: page of {size} bytes drawn in {ms} ms");
    assert!(ms < 2_000, "the page renders in under 2 s: {ms} ms");
}

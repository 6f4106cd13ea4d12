//! `cachalot tune`: for every bundled recording, the recommended setting
//! replays to the peak it printed, no higher than the default's; the last line
//! is the one to paste; bad input gets a clear error.

use std::io::Write;
use std::path::PathBuf;

use cachalot_testkit::cli::{repo, run};
use cachalot_testkit::recordings::every_recording as recordings;

use serde_json::Value;

fn data() -> PathBuf {
    repo().join("data/traces")
}

fn json_of(args: &[&str]) -> Value {
    let out = run(args);
    assert!(
        out.status.success(),
        "cachalot {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

/// The peak reserved bytes of `cachalot replay --conf CONF`.
fn replayed_peak(path: &str, conf: &str) -> u64 {
    json_of(&["replay", path, "--conf", conf, "--json"])["peak_reserved_bytes"]
        .as_u64()
        .expect("a peak")
}

#[test]
fn every_recommendation_replays_to_its_printed_peak_and_beats_the_default() {
    for trace in recordings() {
        let path = trace.to_str().expect("utf-8 path");
        let report = json_of(&["tune", path, "--json"]);
        let default = replayed_peak(path, "");
        for key in ["recommended", "best_pytorch"] {
            let chosen = &report[key];
            let conf = chosen["value"].as_str().expect("a value");
            let printed = chosen["peak_reserved_bytes"].as_u64().expect("a peak");
            assert_eq!(replayed_peak(path, conf), printed, "{path}: {key} {conf}");
            assert!(
                printed <= default,
                "{path}: {key} {conf}: {printed} > {default}"
            );
            assert_runs_and_needs_no_more_than_the_default(&report, path, &[], conf);
        }
        let text = run(&["tune", path]);
        assert!(text.status.success(), "{path}");
        let stdout = String::from_utf8(text.stdout).expect("utf-8");
        let last = stdout.lines().last().expect("a last line");
        let recommended = &report["recommended"];
        assert_eq!(
            last,
            format!(
                "{}={}",
                recommended["variable"].as_str().expect("a variable"),
                recommended["value"].as_str().expect("a value")
            ),
            "{path}"
        );
    }
}

/// The smallest device `report` found for `conf`.
fn smallest_device(report: &Value, conf: &str) -> Option<u64> {
    report["fits"]
        .as_array()
        .expect("fits")
        .iter()
        .find(|f| f["conf"] == conf)
        .and_then(|f| f["smallest_capacity_bytes"].as_u64())
}

/// `conf` replays `path` on the device tuned for with no out-of-memory
/// failure, and needs no larger a device than the default.
fn assert_runs_and_needs_no_more_than_the_default(
    report: &Value,
    path: &str,
    extra: &[&str],
    conf: &str,
) {
    let mut args = vec!["replay", path, "--conf", conf, "--json"];
    args.extend_from_slice(extra);
    assert_eq!(json_of(&args)["ooms"], 0, "{path}: {conf}");
    let need = smallest_device(report, conf).expect("its smallest device was searched");
    if let Some(default) = smallest_device(report, "") {
        assert!(
            need <= default,
            "{path}: {conf} needs {need}, the default {default}"
        );
    }
}

#[test]
fn under_pressure_the_recommendation_runs_and_needs_no_larger_device() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("random.trace.csv.gz");
    let path = path.to_str().expect("utf-8 path");
    let synth = [
        "synth",
        "-o",
        path,
        "--events",
        "60k",
        "--seed",
        "5",
        "--max-size",
        "256MiB",
        "--max-live",
        "3GiB",
    ];
    run(&synth);
    let tight = ["--capacity", "4GiB"];
    let mut args = vec!["tune", path, "--json"];
    args.extend_from_slice(&tight);
    let report = json_of(&args);
    for key in ["recommended", "best_pytorch"] {
        let conf = report[key]["value"].as_str().expect("a value");
        assert_runs_and_needs_no_more_than_the_default(&report, path, &tight, conf);
    }
}

#[test]
fn the_objective_orders_the_ranking() {
    let trace = data().join("bert_dynamic.native.trace.csv.gz");
    let path = trace.to_str().expect("utf-8 path");
    for (objective, first, second) in [
        ("reserved", "peak_reserved_bytes", "driver_calls"),
        ("calls", "driver_calls", "peak_reserved_bytes"),
    ] {
        let report = json_of(&["tune", path, "--objective", objective, "--json"]);
        // Those that ran out of memory last, then by the objective.
        let keys: Vec<(bool, u64, u64)> = report["candidates"]
            .as_array()
            .expect("candidates")
            .iter()
            .map(|c| {
                let n = |key: &str| c[key].as_u64().expect("a number");
                (n("ooms") > 0, n(first), n(second))
            })
            .collect();
        assert!(
            keys.windows(2).all(|w| w[0] <= w[1]),
            "{objective}: {keys:?}"
        );
    }
}

#[test]
fn will_it_fit_gives_a_capacity_that_fits_and_a_page_less_that_does_not() {
    let trace = data().join("resnet50.native.trace.csv.gz");
    let path = trace.to_str().expect("utf-8 path");
    let report = json_of(&["tune", path, "--json", "--fit", "2"]);
    let fits = report["fits"].as_array().expect("fits");
    assert_eq!(
        fits.len(),
        4,
        "two leaders, the best of PyTorch's own allocator and the default"
    );
    for fit in fits {
        let conf = fit["conf"].as_str().expect("conf");
        let least = fit["smallest_capacity_bytes"].as_u64().expect("a capacity");
        let at = |bytes: u64| {
            json_of(&[
                "replay",
                path,
                "--conf",
                conf,
                "--capacity",
                &bytes.to_string(),
                "--json",
            ])["ooms"]
                .as_u64()
                .expect("ooms")
        };
        assert_eq!(at(least), 0, "{conf}");
        assert!(at(least - (2 << 20)) > 0, "{conf}");
    }
}

#[test]
fn a_search_space_of_ones_own() {
    let trace = data().join("bert_dynamic.native.trace.csv.gz");
    let path = trace.to_str().expect("utf-8 path");
    let report = json_of(&[
        "tune",
        path,
        "--space",
        "roundup_power2_divisions=default,4,[256:1,512:2,>:4]",
        "--space",
        "max_split_size_mb=default,128",
        "--json",
    ]);
    let confs: Vec<&str> = report["candidates"]
        .as_array()
        .expect("candidates")
        .iter()
        .map(|c| c["conf"].as_str().expect("conf"))
        .collect();
    assert_eq!(confs.len(), 6, "{confs:?}");
    assert!(confs.contains(&"roundup_power2_divisions:[256:1,512:2,>:4],max_split_size_mb:128"));
}

#[test]
fn with_passes_the_ranking_is_by_what_a_repeated_workload_holds() {
    // Generation repeated: the default cachalot policy holds 1.097 times the
    // live peak from the second pass on (docs/benchmarks.md); the search
    // over passes finds settings that hold 1.05 or less (no slack at all),
    // and its pick replays to the peak it printed.
    let trace = data().join("gpt2_generate.native.trace.csv.gz");
    let path = trace.to_str().expect("utf-8 path");
    let space = [
        "--space",
        "policy=cachalot",
        "--space",
        "cachalot_reuse_slack=default,0",
        "--space",
        "cachalot_reuse_min_mb=default,0",
    ];
    let args = [&["tune", path, "--passes", "3", "--json"][..], &space[..]].concat();
    let report = json_of(&args);
    assert_eq!(report["passes"], 3);
    let live = report["live_peak_bytes"].as_f64().unwrap();
    let best = &report["recommended"];
    let peak = best["peak_reserved_bytes"].as_f64().unwrap();
    assert!(peak <= 1.05 * live, "{best}");
    let candidates = report["candidates"].as_array().unwrap();
    let default = candidates
        .iter()
        .find(|c| c["conf"] == "policy:cachalot")
        .expect("the policy's defaults");
    assert!(default["peak_reserved_bytes"].as_f64().unwrap() > 1.05 * live);
    let conf = best["value"].as_str().unwrap();
    let again = json_of(&["replay", path, "--conf", conf, "--passes", "3", "--json"]);
    assert_eq!(again["peak_reserved_bytes"].as_f64().unwrap(), peak);
}

fn fails_saying(args: &[&str], words: &[&str]) {
    let out = run(args);
    assert_eq!(out.status.code(), Some(1), "cachalot {args:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Notes on what the recording does not say may come first.
    let error = stderr
        .lines()
        .find(|l| !l.starts_with("note: "))
        .unwrap_or_default();
    assert!(error.starts_with("error: "), "{stderr}");
    for word in words {
        assert!(stderr.contains(word), "{args:?}: {stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn bad_input_gets_a_clear_error() {
    let trace = data().join("resnet50.native.trace.csv.gz");
    let path = trace.to_str().expect("utf-8 path");
    fails_saying(
        &["tune", path, "--space", "max_split=64"],
        &["unknown key 'max_split'", "max_split_size_mb"],
    );
    fails_saying(
        &[
            "tune",
            path,
            "--space",
            "pinned_use_cuda_host_register=True",
        ],
        &["does not change device memory"],
    );
    fails_saying(
        &["tune", path, "--space", "max_split_size_mb=8"],
        &["candidate 'max_split_size_mb:8'"],
    );
    fails_saying(
        &["tune", path, "--capacity", "4GiB"],
        &["nothing fits", "5.43 GiB live", "--capacity of at least"],
    );
    let mut empty = tempfile::Builder::new()
        .suffix(".trace.csv")
        .tempfile()
        .expect("a temporary file");
    writeln!(empty, "time_us,action,addr,size,stream\n1,snapshot,0,0,0").expect("written");
    let empty_path = empty.path().to_str().expect("utf-8 path").to_string();
    fails_saying(&["tune", &empty_path], &["no allocations"]);
}

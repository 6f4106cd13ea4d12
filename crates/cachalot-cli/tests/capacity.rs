//! `--capacity`: a simulated device from one 2 MiB page to 256 TiB replays
//! under both policies; anything outside that range is refused, naming it.

use cachalot_testkit::cli::run;
use std::path::{Path, PathBuf};

const MIN: u64 = 2 << 20;
const MAX: u64 = 1 << 48;

fn trace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/traces/seed004.native.trace.csv.gz")
}

/// `cachalot replay --json` of the trace under `policy` on `capacity`.
fn replay(policy: &str, capacity: &str) -> serde_json::Value {
    let trace = trace();
    let path = trace.to_str().expect("utf-8 path");
    let args = [
        "replay",
        path,
        "--policy",
        policy,
        "--capacity",
        capacity,
        "--json",
    ];
    let out = run(&args);
    assert!(
        out.status.success(),
        "cachalot {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

#[test]
fn the_bounds_replay_under_both_policies() {
    for policy in ["pytorch", "cachalot"] {
        let small = replay(policy, &MIN.to_string());
        assert_eq!(small["capacity"], MIN);
        assert!(small["ooms"].as_u64() > Some(0), "{policy}: {small}");
        assert!(small["peak_reserved_bytes"].as_u64() <= Some(MIN));

        let default = replay(policy, "80GiB");
        let large = replay(policy, &MAX.to_string());
        assert_eq!(large["capacity"], MAX);
        assert_eq!(large["ooms"], 0, "{policy}: {large}");
        for key in [
            "peak_requested_bytes",
            "peak_allocated_bytes",
            "peak_reserved_bytes",
        ] {
            assert_eq!(large[key], default[key], "{policy}: {key}");
        }
        let requested = large["peak_requested_bytes"].as_u64();
        assert!(requested <= large["peak_allocated_bytes"].as_u64());
    }
}

#[test]
fn capacities_outside_the_range_are_refused() {
    let trace = trace();
    let path = trace.to_str().expect("utf-8 path");
    let refused = [
        "0".to_string(),
        (MIN - 1).to_string(),
        (MAX + 1).to_string(),
        u64::MAX.to_string(),
        "512TiB".to_string(),
    ];
    for capacity in &refused {
        for command in [
            vec!["replay", path, "--capacity", capacity],
            vec!["compare", path, "--capacity", capacity],
            vec!["summary", path, "--capacity", capacity],
        ] {
            let out = run(&command);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{command:?}: {err}");
            assert!(
                err.contains("between 2 MiB (2097152 bytes) and 256 TiB (281474976710656 bytes)"),
                "{command:?}: {err}"
            );
        }
    }
    let out = run(&["replay", path, "--capacity", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("a device of 0 bytes"), "{err}");
}

#[test]
fn capacities_take_units() {
    let trace = trace();
    let path = trace.to_str().expect("utf-8 path");
    for (text, bytes) in [("24GB", 24_000_000_000u64), ("512MiB", 512 << 20)] {
        let out = run(&["replay", path, "--capacity", text, "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(report["capacity"], bytes);
    }
}

//! The command line's conventions: `-` is standard output, sizes read and
//! print in units past GiB, names and fields of hostile inputs never reach
//! the terminal raw, counts agree between subcommands, and the command names
//! itself.

use cachalot_testkit::cli::{repo, run, succeeds};

fn data(name: &str) -> String {
    repo().join("data/traces").join(name).display().to_string()
}

#[test]
fn a_dash_writes_to_standard_output() {
    let trace = data("seed004.native.trace.csv.gz");
    let page = succeeds(&["view", &trace, "-o", "-"]);
    assert!(page.starts_with("<!DOCTYPE html>"), "{}", &page[..100]);
    let json = run(&["summary", &trace, "--json", "-"]);
    assert!(json.status.success());
    let dump: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON alone");
    assert!(
        dump["segments"].is_array() || dump["snapshot"].is_object(),
        "{dump}"
    );
    let table = String::from_utf8_lossy(&json.stderr);
    assert!(table.contains("memory summary, device ID 0"), "{table}");
    let pickle = run(&["summary", &trace, "--pickle", "-"]);
    assert!(pickle.status.success());
    assert_eq!(pickle.stdout.first(), Some(&0x80), "a pickle");
    let both = run(&["summary", &trace, "--pickle", "-", "--json", "-"]);
    assert_eq!(both.status.code(), Some(1));
    let csv = succeeds(&["synth", "-o", "-", "--events", "100"]);
    assert!(
        csv.starts_with("time_us,action,addr,size,stream\n"),
        "{csv}"
    );
    assert!(!std::path::Path::new("-").exists(), "no file named -");
}

#[test]
fn the_command_names_itself() {
    assert!(succeeds(&["--version"]).starts_with("cachalot "));
}

#[test]
fn sizes_print_past_gib_and_read_with_decimals() {
    let trace = data("seed004.native.trace.csv.gz");
    let table = succeeds(&["replay", &trace, "--capacity", "256TiB"]);
    assert!(
        table.contains("256.00 TiB (281474976710656 bytes)"),
        "{table}"
    );
    let summary = succeeds(&["summary", &trace, "--capacity", "1.5GiB"]);
    assert!(
        summary.contains("simulated device of 1.50 GiB (1610612736 bytes)"),
        "{summary}"
    );
}

#[test]
fn control_characters_in_names_and_fields_are_escaped() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let trace = dir.path().join("evil\u{1b}[2J.trace.csv");
    std::fs::write(
        &trace,
        "time_us,action,addr,size,stream\n1,al\u{1b}]0;x\u{7}loc,4096,512,0\n",
    )
    .expect("writes");
    let out = run(&["replay", trace.to_str().expect("utf-8 path")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains('\u{1b}') && !err.contains('\u{7}'), "{err:?}");
    assert!(err.contains("evil\\u{1b}[2J"), "{err}");
}

#[test]
fn a_page_named_to_hide_its_data_still_draws() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let named = dir.path().join("<!--<script>x.csv.gz");
    std::fs::copy(data("seed004.native.trace.csv.gz"), &named).expect("copies");
    let page = succeeds(&["view", named.to_str().expect("utf-8 path"), "-o", "-"]);
    let data = page
        .split("<script type=\"application/json\" id=\"data\">")
        .nth(1)
        .and_then(|rest| rest.split("</script>").next())
        .expect("the data element");
    assert!(!data.contains('<'), "the data element holds no '<'");
    assert!(
        data.contains("\\u003c!--\\u003cscript\\u003ex.csv.gz"),
        "{data}"
    );
}

#[test]
fn a_bad_stats_file_is_named_and_a_missing_one_is_noted() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let trace = dir.path().join("run.trace.csv.gz");
    std::fs::copy(data("seed004.native.trace.csv.gz"), &trace).expect("copies");
    let trace = trace.to_str().expect("utf-8 path");
    let missing = run(&["replay", trace]);
    assert!(missing.status.success());
    let note = String::from_utf8_lossy(&missing.stderr);
    assert!(
        note.contains("no stats file (NAME.stats.json.gz) beside it")
            && note.contains("give --capacity and --conf"),
        "{note}"
    );
    let given = run(&["replay", trace, "--capacity", "80GiB", "--conf", ""]);
    assert!(String::from_utf8_lossy(&given.stderr).is_empty());
    let stats = dir.path().join("run.stats.json.gz");
    std::fs::write(&stats, b"not gzip, not JSON").expect("writes");
    let bad = run(&["replay", trace]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("the stats file beside it, {}", stats.display())),
        "{err}"
    );
}

#[test]
fn passes_count_events_as_they_count_allocations() {
    let trace = data("seed004.native.trace.csv.gz");
    let one: serde_json::Value =
        serde_json::from_str(&succeeds(&["replay", &trace, "--json"])).expect("JSON");
    let three: serde_json::Value =
        serde_json::from_str(&succeeds(&["replay", &trace, "--json", "--passes", "3"]))
            .expect("JSON");
    for key in ["events", "allocs"] {
        assert_eq!(
            three[key].as_u64().expect("a count"),
            3 * one[key].as_u64().expect("a count"),
            "{key}"
        );
    }
}

#[test]
fn a_snapshot_without_history_reports_its_segments() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let snapshot = dir.path().join("no_history.pickle");
    let snapshot = snapshot.to_str().expect("utf-8 path");
    let trace = data("bert_dynamic.native.trace.csv.gz");
    succeeds(&["summary", &trace, "--max-events", "0", "--pickle", snapshot]);
    let report: serde_json::Value =
        serde_json::from_str(&succeeds(&["replay", snapshot, "--json"])).expect("JSON");
    assert_eq!(report["events"], 0, "{report}");
    assert!(
        report["inferred"]["segments"].as_u64() > Some(0),
        "{report}"
    );
    assert!(
        report["peak_reserved_bytes"].as_u64() > Some(1 << 30),
        "{report}"
    );
    assert!(
        report["peak_allocated_bytes"].as_u64() > Some(0),
        "{report}"
    );
}

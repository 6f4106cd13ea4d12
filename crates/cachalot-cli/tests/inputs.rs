//! What the replaying subcommands accept, and how they say what is wrong with
//! an input: every input kind by its content, errors with one prefix, the
//! place in the file of an inconsistent event.

use cachalot_testkit::cli::{repo, run, succeeds};

fn data(name: &str) -> String {
    repo().join("data").join(name).display().to_string()
}

/// The standard error of a command that must fail with status 1.
fn fails(args: &[&str]) -> String {
    let out = run(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "cachalot {args:?}: {err}");
    assert!(err.starts_with("error: "), "cachalot {args:?}: {err}");
    assert!(!err.contains("panicked"), "cachalot {args:?}: {err}");
    err
}

#[test]
fn the_json_that_summary_writes_replays_and_compares() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let trace = data("traces/seed004.native.trace.csv.gz");
    let json = dir.path().join("seed004.json.gz");
    let json = json.to_str().expect("utf-8 path");
    succeeds(&["summary", &trace, "--json", json]);
    // Told apart by content, not by name.
    let renamed = dir.path().join("seed004.run");
    std::fs::copy(json, &renamed).expect("copies");
    for input in [json, renamed.to_str().expect("utf-8 path")] {
        let report: serde_json::Value =
            serde_json::from_str(&succeeds(&["replay", input, "--json"])).expect("JSON");
        assert_eq!(report["events"], 333, "{report}");
        let table = succeeds(&["compare", input]);
        assert_eq!(table.lines().count(), 4, "{table}");
    }
}

#[test]
fn a_json_file_that_is_not_a_snapshot_is_named_as_such() {
    let stats = data("traces/seed004.native.stats.json.gz");
    for command in ["replay", "compare", "summary"] {
        let err = fails(&[command, &stats]);
        assert!(
            err.contains("a JSON file that is not a cachalot JSON snapshot"),
            "{command}: {err}"
        );
        assert!(!err.contains("4096 bytes"), "{command}: {err}");
    }
}

#[test]
fn every_subcommand_uses_one_error_prefix() {
    let missing = "/nonexistent/trace.csv";
    for command in [
        vec!["replay", missing],
        vec!["compare", missing],
        vec!["summary", missing],
        vec!["view", missing],
    ] {
        fails(&command);
    }
}

#[test]
fn a_second_free_names_its_csv_line_and_address_as_written() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let trace = dir.path().join("bad.trace.csv");
    std::fs::write(
        &trace,
        "time_us,action,addr,size,stream\n\
         1,alloc,139637976727552,512,0\n\
         \n\
         2,free_completed,139637976727552,512,0\n\
         3,free_completed,139637976727552,512,0\n",
    )
    .expect("writes");
    let err = fails(&["replay", trace.to_str().expect("utf-8 path")]);
    assert!(
        err.contains(
            "trace CSV line 5: free_completed of address 139637976727552, which was already freed"
        ),
        "{err}"
    );
}

#[test]
fn a_free_of_an_address_never_seen_is_of_an_allocation_before_the_first_event() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let trace = dir.path().join("late.trace.csv");
    std::fs::write(
        &trace,
        "time_us,action,addr,size,stream\n\
         1,alloc,139637976727552,512,0\n\
         2,free_completed,139637976728064,4096,0\n",
    )
    .expect("writes");
    let out = run(&["replay", trace.to_str().expect("utf-8 path"), "--json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("(1 allocations of 4.00 KiB made: 1 known from their frees)"),
        "{err}"
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["inferred"]["from_frees"], 1, "{report}");
    assert_eq!(report["peak_requested_bytes"], 4096 + 512, "{report}");
    // The allocation made before the first event sets up the replay; the
    // counts are the recording's.
    assert_eq!(report["allocs"], 1, "{report}");
    assert_eq!(report["frees"], 1, "{report}");
}

#[test]
fn configuration_keys_of_another_policy_are_refused() {
    let trace = data("traces/seed004.native.trace.csv.gz");
    let expandable = data("traces/seed002.expandable.trace.csv.gz");
    let cases = [
        (
            vec![
                "replay",
                &trace,
                "--conf",
                "policy:cachalot,expandable_segments:True",
            ],
            "'expandable_segments' applies to the pytorch policy, not the cachalot policy",
        ),
        (
            vec![
                "replay",
                &trace,
                "--policy",
                "cachalot",
                "--conf",
                "max_split_size_mb:64",
            ],
            "'max_split_size_mb' applies to the pytorch policy, not the cachalot policy",
        ),
        (
            vec!["replay", &expandable, "--policy", "cachalot"],
            "the recorded configuration 'expandable_segments:True': allocator config key \
             'expandable_segments' applies to the pytorch policy, not the cachalot policy; \
             give one with --conf",
        ),
        (
            vec!["summary", &trace, "--conf", "cachalot_reuse_slack:0.1"],
            "'cachalot_reuse_slack' applies to the cachalot policy, not the pytorch policy",
        ),
    ];
    for (command, said) in cases {
        let err = fails(&command);
        assert!(err.contains(said), "{command:?}: {err}");
    }
}

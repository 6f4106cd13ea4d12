//! What `cachalot replay` says when the simulated device runs out: how often,
//! in good English, and advice that fits the policy replayed.

/// The standard error of `cachalot replay` of `allocs` allocations of 4 MiB
/// on a 2 MiB device under `policy`.
fn replay_out_of_memory(allocs: usize, policy: &str) -> String {
    let dir = tempfile::tempdir().expect("a temp dir");
    let trace = dir.path().join("big.trace.csv");
    let mut text = "time_us,action,addr,size,stream\n".to_string();
    for i in 0..allocs {
        text.push_str(&format!("{i},alloc,{},4194304,0\n", (i + 1) << 30));
    }
    std::fs::write(&trace, text).expect("writes");
    let out = cachalot_testkit::cli::cachalot()
        .arg("replay")
        .arg(&trace)
        .args(["--capacity", "2MiB", "--policy", policy])
        .output()
        .expect("cachalot runs");
    assert!(out.status.success(), "{out:?}");
    // What follows the notes on what the recording does not say.
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .skip_while(|l| l.starts_with("note: "))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_count_of_failures_is_pluralized() {
    let once = replay_out_of_memory(1, "pytorch");
    assert!(
        once.starts_with("the replay ran out of memory 1 time (that allocation was skipped)"),
        "{once}"
    );
    let twice = replay_out_of_memory(2, "pytorch");
    assert!(
        twice.starts_with("the replay ran out of memory 2 times (those allocations were skipped)"),
        "{twice}"
    );
}

#[test]
fn the_cachalot_policy_is_not_advised_to_itself() {
    let pytorch = replay_out_of_memory(1, "pytorch");
    assert!(pytorch.contains("(or policy:cachalot)"), "{pytorch}");
    let cachalot = replay_out_of_memory(1, "cachalot");
    assert!(cachalot.contains("CUDA out of memory"), "{cachalot}");
    assert!(!cachalot.contains("policy:cachalot"), "{cachalot}");
    assert!(!cachalot.contains("expandable_segments"), "{cachalot}");
}

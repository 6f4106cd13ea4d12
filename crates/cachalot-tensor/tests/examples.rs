//! Runs every example on the simulated device and checks what it prints: the
//! memory checkpoints against PyTorch's own runs, the OOM message, the leak
//! report, the GPU-to-GPU copy and the prefetching loader.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

fn example(name: &str) -> PathBuf {
    // target/<profile>/deps/examples-<hash> -> target/<profile>/examples/<name>
    let exe = std::env::current_exe().expect("the test binary has a path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary lives in target/<profile>/deps");
    dir.join("examples").join(name)
}

fn run(name: &str, conf: &str) -> String {
    let out = Command::new(example(name))
        .env("CACHALOT_DEVICE", "sim")
        .env("PYTORCH_CUDA_ALLOC_CONF", conf)
        .output()
        .unwrap_or_else(|e| {
            panic!("example {name} did not start (cargo test builds examples first): {e}")
        });
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name} failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// `checkpoint\tlabel\tallocated\treserved` lines.
fn checkpoints(output: &str) -> Vec<(String, i64, i64)> {
    output
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            match f.as_slice() {
                ["checkpoint", label, a, r] => {
                    Some((label.to_string(), a.parse().ok()?, r.parse().ok()?))
                }
                _ => None,
            }
        })
        .collect()
}

fn pytorch_checkpoints(stats: &str) -> Vec<(String, i64, i64)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/traces")
        .join(stats);
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut json = String::new();
    flate2::read::GzDecoder::new(file)
        .read_to_string(&mut json)
        .expect("gzip JSON");
    let v: serde_json::Value = serde_json::from_str(&json).expect("stats JSON");
    v["checkpoints"]
        .as_array()
        .expect("checkpoints list")
        .iter()
        .map(|c| {
            let label = c[0].as_str().expect("label").to_string();
            (
                label,
                c[1].as_i64().expect("allocated"),
                c[2].as_i64().expect("reserved"),
            )
        })
        .collect()
}

fn fields(output: &str) -> HashMap<String, Vec<String>> {
    output
        .lines()
        .filter_map(|l| {
            let mut f = l.split('\t');
            let key = f.next()?.to_string();
            Some((key, f.map(str::to_string).collect()))
        })
        .collect()
}

#[test]
fn one_gib_matches_pytorch_native() {
    assert_eq!(
        checkpoints(&run("one_gib", "")),
        pytorch_checkpoints("seed002.native.stats.json.gz")
    );
}

#[test]
fn one_gib_matches_pytorch_expandable_segments() {
    let ours = checkpoints(&run("one_gib", "expandable_segments:True"));
    assert_eq!(
        ours,
        pytorch_checkpoints("seed002.expandable.stats.json.gz")
    );
}

#[test]
fn matmul_and_transfers_match_pytorch_with_the_cublas_workspace() {
    let out = run("matmul_and_transfers", "");
    assert_eq!(
        checkpoints(&out),
        pytorch_checkpoints("seed004.native.stats.json.gz")
    );
    let check = &fields(&out)["check"];
    assert_eq!(check[0], "y[0]-x[0]=1.0000");
    let (z, dot) = (
        &check[1]["z[0,1]=".len()..],
        &check[2]["row0.row1=".len()..],
    );
    assert_eq!(z, dot, "the product disagrees with a host dot product");
}

#[test]
fn oom_prints_pytorchs_message_and_recovers() {
    let out = run("oom", "");
    let f = fields(&out);
    // PyTorch's golden run (data/golden, oom_fraction_0.01): 12 allocations of 64 MiB fit.
    assert_eq!(f["allocs_before_oom"], ["12"]);
    assert_eq!(f["is_out_of_memory"], ["true"]);
    let msg = &f["error"][0];
    assert!(msg.starts_with("CUDA out of memory. Tried to allocate 64.00 MiB. GPU 0 has a total capacity of 79.18 GiB"), "{msg}");
    assert!(
        msg.contains("810.79 MiB allowed; Of the allocated memory 768.00 MiB is allocated"),
        "{msg}"
    );
    assert_eq!(f["after_oom"], ["805306368", "805306368"]);
    assert_eq!(f["num_ooms"], ["1"]);
    assert_eq!(f["recovered"], ["7", "469762048", "805306368"]);
}

#[test]
fn training_leak_check_names_the_kept_tensor() {
    let out = run("training_leak", "");
    let leaks: Vec<&str> = out.lines().filter(|l| l.starts_with("leak\t")).collect();
    assert_eq!(
        leaks,
        ["leak\tactivations\tfloat32[64, 256]\t65536"],
        "{out}"
    );
    assert!(
        out.contains("'activations' float32[64, 256] (64.00 KiB)"),
        "{out}"
    );
    assert!(
        out.contains("created at crates/cachalot-tensor/examples/training_leak.rs:"),
        "{out}"
    );
    assert!(out.contains("after fix: cuda:0: no leaks"), "{out}");
}

#[test]
fn two_gpus_copy_is_exact() {
    let out = run("two_gpus", "");
    let f = fields(&out);
    assert_eq!(f["equal"], ["true"], "{out}");
    assert_eq!(f["cuda:1"], ["4194304", "20971520"]);
    assert!(out.contains("under the guard Device::cuda() is cuda:1"));
    assert!(out.contains("after the guard Device::cuda() is cuda:0"));
}

#[test]
fn prefetch_runs_and_reuses_pinned_blocks() {
    let out = run("prefetch", "");
    let f = fields(&out);
    assert!(
        f.contains_key("with prefetch") && f.contains_key("without prefetch"),
        "{out}"
    );
    assert!(out.contains("pinned: true"), "{out}");
    assert_eq!(
        f["pinned per batch"],
        ["host_allocs 0", "reuses 8"],
        "{out}"
    );
}

//! Every scenario of every bundled PyTorch golden file passes, every key after
//! every op.

use std::path::PathBuf;

use cachalot::golden::{self, H100_BYTES};

fn golden_files() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/golden");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".json.gz"))
        .collect();
    files.sort();
    files
}

#[test]
fn all_goldens_pass() {
    let files = golden_files();
    assert_eq!(files.len(), 8, "eight bundled golden files");
    let mut failures = Vec::new();
    let mut scenarios = 0;
    for f in &files {
        for entry in golden::load(f).unwrap() {
            let outcome = golden::check(&entry, H100_BYTES);
            scenarios += 1;
            assert!(outcome.checked > 0);
            if let Some(m) = outcome.mismatches.first() {
                failures.push(format!("{} {}: {m:?}", f.display(), outcome.name));
            }
        }
    }
    assert_eq!(scenarios, 60 + 48);
    assert!(
        failures.is_empty(),
        "{} failing scenarios:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn a_wrong_expectation_is_reported() {
    let files = golden_files();
    let mut entry = golden::load(&files[0]).unwrap().remove(0);
    *entry.after[3]
        .get_mut("allocated_bytes.all.current")
        .unwrap() += 512;
    let outcome = golden::check(&entry, H100_BYTES);
    assert!(!outcome.passed());
    let m = &outcome.mismatches[0];
    assert_eq!(
        (m.op, m.key.as_str()),
        (Some(3), "allocated_bytes.all.current")
    );
}

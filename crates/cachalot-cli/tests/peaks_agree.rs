//! Every bundled recording through `replay`, `compare`, `summary` and `view`:
//! the four subcommands share one replay, so they must show the same peaks.

use cachalot_testkit::cli::succeeds;
use cachalot_testkit::recordings::every_recording as recordings;

/// PyTorch's `memory_summary` size cell: whole units, the unit chosen so the
/// number stays under 768 of it.
fn summary_cell(bytes: u64) -> String {
    let mut size = bytes;
    let mut unit = "B  ";
    let mut reference = bytes as f64;
    for next in ["KiB", "MiB", "GiB", "TiB", "PiB"] {
        if reference < 768.0 * 1024.0 {
            break;
        }
        unit = next;
        size /= 1024;
        reference /= 1024.0;
    }
    format!("{size:6} {unit}")
}

/// The peak cell of the summary row that starts with `metric`.
fn summary_peak(table: &str, metric: &str) -> String {
    let row = table
        .lines()
        .find(|l| l.starts_with(&format!("| {metric}")))
        .unwrap_or_else(|| panic!("no {metric} row in\n{table}"));
    row.split('|')
        .nth(3)
        .expect("a peak column")
        .trim()
        .to_string()
}

/// The number after `label` in `text`.
fn number_after(text: &str, label: &str) -> u64 {
    let at = text
        .find(label)
        .unwrap_or_else(|| panic!("{label} in {text}"));
    // The exact count, in parentheses after the size in units.
    let start = at + text[at..].find('(').expect("a count in parentheses") + 1;
    let digits: String = text[start..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().expect("a number")
}

#[test]
fn every_subcommand_shows_the_same_peaks() {
    let dir = tempfile::tempdir().expect("a temp dir");
    for path in recordings() {
        let trace = path.to_str().expect("utf-8 path");
        let name = path.file_name().expect("a file").to_string_lossy();
        let replay: serde_json::Value =
            serde_json::from_str(&succeeds(&["replay", trace, "--json"])).expect("JSON");
        let peak = |key: &str| replay[key].as_u64().expect("a peak");
        let (requested, allocated, reserved) = (
            peak("peak_requested_bytes"),
            peak("peak_allocated_bytes"),
            peak("peak_reserved_bytes"),
        );

        let compared: serde_json::Value =
            serde_json::from_str(&succeeds(&["compare", trace, "--json"])).expect("JSON");
        let same = compared
            .as_array()
            .expect("one entry per configuration")
            .iter()
            .find(|c| c["policy"] == replay["policy"] && c["conf"] == replay["conf"])
            .unwrap_or_else(|| panic!("{name}: compare replays the recorded configuration"));
        for key in [
            "peak_requested_bytes",
            "peak_allocated_bytes",
            "peak_reserved_bytes",
        ] {
            assert_eq!(same[key], replay[key], "{name}: compare's {key}");
        }

        let table = succeeds(&["summary", trace]);
        for (metric, bytes) in [
            ("Requested memory", requested),
            ("Allocated memory", allocated),
            ("GPU reserved memory", reserved),
        ] {
            assert_eq!(
                summary_peak(&table, metric),
                summary_cell(bytes).trim(),
                "{name}: summary's {metric}"
            );
        }

        let page = dir.path().join(format!("{name}.html"));
        let line = succeeds(&["view", trace, "-o", page.to_str().expect("utf-8 path")]);
        assert_eq!(
            number_after(&line, "peak active "),
            requested,
            "{name}: view"
        );
        assert_eq!(
            number_after(&line, "peak reserved "),
            reserved,
            "{name}: view"
        );
    }
}

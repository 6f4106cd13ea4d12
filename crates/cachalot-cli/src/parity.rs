//! `cachalot parity GOLDEN...`: one line per scenario, then `N passed, M failed`;
//! exit status 1 on any mismatch.

use std::path::PathBuf;
use std::process::ExitCode;

use cachalot::golden::{self, Outcome, H100_BYTES};

use crate::output::{Output, OutputError};
use crate::CliError;

/// Arguments of `cachalot parity`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Golden scenario files (`scenarios.<conf>.json.gz`).
    #[arg(required = true)]
    goldens: Vec<PathBuf>,
    /// Simulated device size, 2 MiB to 256 TiB: bytes or a number with a unit
    /// (80GiB, 24GB); the goldens were recorded on an H100.
    #[arg(long, default_value_t = H100_BYTES, value_parser = crate::capacity::parse)]
    capacity: u64,
    /// Mismatches shown per failing scenario.
    #[arg(long, default_value_t = 10)]
    show: usize,
}

/// Runs the check.
pub(crate) fn run(args: &Args, out: &mut Output) -> Result<ExitCode, CliError> {
    let (mut passed, mut failed) = (0usize, 0usize);
    for path in &args.goldens {
        let file = path.file_name().map_or_else(
            || crate::output::shown(path),
            |n| crate::output::printable(&n.to_string_lossy()),
        );
        let entries = match golden::load(path) {
            Ok(e) => e,
            Err(e) => {
                out.line(format_args!("FAIL {file}: {e}"))?;
                failed += 1;
                continue;
            }
        };
        for entry in &entries {
            let outcome = golden::check(entry, args.capacity);
            print_outcome(out, &file, &entry.conf, &outcome, args.show)?;
            if outcome.passed() {
                passed += 1;
            } else {
                failed += 1;
            }
        }
    }
    out.line(format_args!("{passed} passed, {failed} failed"))?;
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn print_outcome(
    out: &mut Output,
    file: &str,
    conf: &str,
    o: &Outcome,
    show: usize,
) -> Result<(), OutputError> {
    let conf = if conf.is_empty() { "native" } else { conf };
    let verdict = if o.passed() { "PASS" } else { "FAIL" };
    out.line(format_args!(
        "{verdict} {file} [{conf}] {}: {} ops, {} values compared",
        o.name, o.ops, o.checked
    ))?;
    for m in o.mismatches.iter().take(show) {
        let at =
            m.op.map_or_else(|| "scenario".to_string(), |i| format!("op {i}"));
        out.line(format_args!(
            "    {at}: {}: expected {}, got {}",
            m.key, m.expected, m.got
        ))?;
    }
    if o.mismatches.len() > show {
        out.line(format_args!(
            "    ... {} more mismatches",
            o.mismatches.len() - show
        ))?;
    }
    if let Some(note) = &o.note {
        out.line(format_args!("    note: {note}"))?;
    }
    Ok(())
}

//! `cachalot tune RECORDING [--capacity SIZE] [--objective reserved|calls]
//! [--space KEY=V1,V2,...] [--passes N] [--json]`: replays a recording under
//! many allocator settings, ranks them, says the smallest device the leaders
//! need, and ends with the line to paste (`PYTORCH_CUDA_ALLOC_CONF=...`, or
//! `CACHALOT_ALLOC_CONF=...` when cachalot's own policy wins). With
//! `--passes`, each setting runs the recording pass after pass, so the ranking
//! is by what a repeated workload (a training loop, a server) holds and calls.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::ExitCode;

use cachalot::error::format_bytes;
use cachalot::tune::{self, Candidate, Fit, Objective, Ranking, Space, Workload};
use cachalot::PolicyKind;
use serde::Serialize;

use crate::input::{load, InputError};
use crate::output::{Output, OutputError};
use crate::replay::parse_passes;
use crate::{capacity, progress, CliError};

/// Arguments of `cachalot tune`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// A trace CSV, a snapshot pickle (plain or gzip) or a cachalot JSON snapshot.
    recording: PathBuf,
    /// The device to fit, 2 MiB to 256 TiB: bytes or a number with a unit
    /// (80GiB, 24GB); default: the recorded device's (an H100 80GB when unknown).
    #[arg(long, value_parser = capacity::parse)]
    capacity: Option<u64>,
    /// What to minimise first: peak reserved bytes, or driver calls.
    #[arg(long, default_value = "reserved")]
    objective: Objective,
    /// Search these values of a key instead of the default search
    /// (`max_split_size_mb=default,64,128`; repeat for more keys; their product
    /// is searched; `default` leaves the key out).
    #[arg(long = "space", value_name = "KEY=V1,V2,...")]
    space: Vec<String>,
    /// Rows of the ranking to print.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// Leading candidates whose smallest device is searched.
    #[arg(long, default_value_t = 3)]
    fit: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Of a snapshot of several devices, the device to tune for.
    #[arg(long, value_name = "N")]
    snapshot_device: Option<usize>,
    /// Run the recording this many times in a row under each setting (1 to
    /// 10000), as `cachalot replay --passes` does: rank by what a repeated
    /// workload holds and calls.
    #[arg(long, value_name = "N", default_value = "1", value_parser = parse_passes)]
    passes: NonZeroUsize,
}

/// What `--json` prints.
#[derive(Debug, Serialize)]
struct Report<'a> {
    recording: String,
    #[serde(flatten)]
    ranking: &'a Ranking,
    fits: &'a [Fit],
    /// The line to paste: the best-ranked candidate that fits the device and
    /// needs no larger a device than the default (see [`tune::recommend`]).
    recommended: Option<Recommendation>,
    /// The best setting of PyTorch's own allocator, when one fits.
    best_pytorch: Option<Recommendation>,
}

/// An environment variable and its value.
#[derive(Debug, Serialize)]
struct Recommendation {
    variable: &'static str,
    value: String,
    peak_reserved_bytes: u64,
}

impl Recommendation {
    fn of(candidate: &Candidate) -> Recommendation {
        let variable = if candidate.policy == PolicyKind::Cachalot.name() {
            "CACHALOT_ALLOC_CONF"
        } else {
            "PYTORCH_CUDA_ALLOC_CONF"
        };
        Recommendation {
            variable,
            value: candidate.conf.clone(),
            peak_reserved_bytes: candidate.peak_reserved_bytes,
        }
    }

    fn line(&self) -> String {
        format!("{}={}", self.variable, self.value)
    }
}

/// Runs the subcommand.
pub(crate) fn run(args: &Args, out: &mut Output) -> Result<ExitCode, CliError> {
    let (ranking, fits) = search(args).map_err(CliError::input(&args.recording))?;
    let report = Report {
        recording: crate::output::shown(&args.recording),
        ranking: &ranking,
        fits: &fits,
        recommended: tune::recommend(&ranking, &fits, None).map(Recommendation::of),
        best_pytorch: tune::recommend(&ranking, &fits, Some(PolicyKind::Pytorch))
            .map(Recommendation::of),
    };
    if args.json {
        out.json(&report)?;
    } else {
        print_report(out, &report, args.top)?;
    }
    Ok(if report.recommended.is_some() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn search(args: &Args) -> Result<(Ranking, Vec<Fit>), InputError> {
    let loaded = load(&args.recording, args.snapshot_device)?;
    loaded.note_defaults(args.capacity.is_some(), true);
    let capacity = args
        .capacity
        .map_or_else(|| loaded.recorded_capacity(), Ok)?;
    let space = if args.space.is_empty() {
        Space::default_for(Workload {
            live_peak: tune::live_peak(&loaded.plan),
            capacity,
        })
    } else {
        Space::from_specs(&args.space)?
    };
    let candidates = space.candidates()?;
    let bar = progress::steps(candidates.len() as u64, "tune");
    let ranking = tune::search(
        &loaded.plan,
        candidates,
        capacity,
        args.passes,
        args.objective,
        &|done| bar.set_position(done as u64),
    );
    bar.finish_and_clear();
    let ranking = ranking?;
    let fits = tune::fit_leaders(&loaded.plan, &ranking, args.fit)?;
    Ok((ranking, fits))
}

fn conf_label(conf: &str) -> &str {
    if conf.is_empty() {
        "(default)"
    } else {
        conf
    }
}

fn print_report(out: &mut Output, report: &Report, top: usize) -> Result<(), OutputError> {
    let r = report.ranking;
    let by = match r.objective {
        Objective::Reserved => "peak reserved, then driver calls",
        Objective::Calls => "driver calls, then peak reserved",
    };
    let passes = match r.passes.get() {
        1 => String::new(),
        n => format!(", {n} passes each"),
    };
    out.line(format_args!(
        "{}: {} configurations replayed on a {} device{passes} (live peak {}), ranked by {by}",
        report.recording,
        r.candidates.len(),
        format_bytes(r.capacity),
        format_bytes(r.live_peak_bytes),
    ))?;
    print_ranking(out, r, top)?;
    out.line("")?;
    out.line("will it fit? the smallest device each runs on without running out of memory:")?;
    for fit in report.fits {
        let size = fit
            .smallest_capacity_bytes
            .map_or_else(|| "none up to 256 TiB".to_string(), format_bytes);
        out.line(format_args!("  {size:>12}  {}", conf_label(&fit.conf)))?;
    }
    out.line("")?;
    print_recommendation(out, report)
}

/// The leaders (one row per outcome, its shortest configuration) down to
/// `top`, and the default's row wherever it ranks (the default, the shortest
/// configuration, always leads its outcome).
fn print_ranking(out: &mut Output, r: &Ranking, top: usize) -> Result<(), OutputError> {
    let oom_header = format!("ooms on {}", format_bytes(r.capacity));
    out.line(format_args!(
        "{:>5}  {:>13}  {:>12}  {:>12}  {oom_header}  configuration",
        "rank", "peak reserved", "waste", "driver calls"
    ))?;
    let width = oom_header.len();
    let shown = r
        .leaders()
        .enumerate()
        .filter(|(i, c)| *i < top || c.conf.is_empty());
    for (i, c) in shown {
        let alike = match r.alike(c) {
            0 => String::new(),
            n => format!(" (and {n} alike)"),
        };
        out.line(format_args!(
            "{:>5}  {:>13}  {:>12}  {:>12}  {:>width$}  {}{alike}",
            i + 1,
            format_bytes(c.peak_reserved_bytes),
            format_bytes(c.waste_bytes),
            c.driver_calls,
            c.ooms,
            conf_label(&c.conf)
        ))?;
    }
    Ok(())
}

fn print_recommendation(out: &mut Output, report: &Report) -> Result<(), OutputError> {
    let Some(best) = &report.recommended else {
        return out.line(format_args!(
            "nothing fits: every configuration ran out of memory on the {} device; \
             the smallest devices above are what the leaders need",
            format_bytes(report.ranking.capacity)
        ));
    };
    let default = report.ranking.default_candidate();
    let saved = |peak: u64| match default {
        Some(d) if d.fits() && d.peak_reserved_bytes > peak => {
            format!(
                "{} less than the default",
                format_bytes(d.peak_reserved_bytes - peak)
            )
        }
        Some(d) if d.fits() => "no less than the default".to_string(),
        _ => "the default runs out of memory".to_string(),
    };
    if let Some(pytorch) = report
        .best_pytorch
        .as_ref()
        .filter(|_| best.variable != "PYTORCH_CUDA_ALLOC_CONF")
    {
        out.line(format_args!(
            "# best on PyTorch's own allocator ({} peak reserved, {}): {}",
            format_bytes(pytorch.peak_reserved_bytes),
            saved(pytorch.peak_reserved_bytes),
            pytorch.line()
        ))?;
    }
    let how = if best.variable == "CACHALOT_ALLOC_CONF" {
        "with cachalot_torch.use()"
    } else if best.value.is_empty() {
        "PyTorch's default: leave PYTORCH_CUDA_ALLOC_CONF unset or empty"
    } else {
        "PyTorch's own allocator"
    };
    out.line(format_args!(
        "# recommended ({how}; {} peak reserved, {}):",
        format_bytes(best.peak_reserved_bytes),
        saved(best.peak_reserved_bytes)
    ))?;
    out.line(best.line())
}

//! `--device`: where a replay runs, `sim` (a simulated device, the default) or
//! `cuda:N` (GPU N, through the CUDA driver: its real segments and calls).

use std::fmt;
use std::sync::Arc;

use cachalot::backend::cuda::CudaBackend;
use cachalot::backend::BackendError;
use cachalot::replay::{Device, Op, Plan};
use cachalot::StreamId;
use thiserror::Error;

/// A replay's device, as named on the command line.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum Target {
    /// A simulated device.
    #[default]
    Sim,
    /// A GPU, by ordinal.
    Cuda(usize),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Sim => f.write_str("sim"),
            Target::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// Parses `sim`, `cuda` or `cuda:N`.
pub(crate) fn parse(text: &str) -> Result<Target, String> {
    let bad = || format!("'{text}' is not a device: give sim or cuda:N (cuda:0 is the first GPU)");
    match text {
        "sim" => Ok(Target::Sim),
        "cuda" => Ok(Target::Cuda(0)),
        _ => {
            let n = text.strip_prefix("cuda:").ok_or_else(bad)?;
            n.parse().map(Target::Cuda).map_err(|_| bad())
        }
    }
}

/// A GPU that could not be opened. Remedy: check the driver and the ordinal
/// (`nvidia-smi`), or replay on `sim`.
#[derive(Debug, Error)]
#[error("cannot replay on {target}: {source}")]
pub(crate) struct TargetError {
    target: Target,
    source: BackendError,
}

/// Opens GPU `ordinal` for a replay of `plan`; each stream the recording used
/// other than the default becomes a stream of that GPU.
pub(crate) fn open_cuda(ordinal: usize, plan: &mut Plan) -> Result<Device, TargetError> {
    let fail = |source| TargetError {
        target: Target::Cuda(ordinal),
        source,
    };
    let gpu = CudaBackend::new(ordinal).map_err(fail)?;
    let mut streams: Vec<(StreamId, StreamId)> = Vec::new();
    for op in &mut plan.ops {
        let Op::Alloc { stream, .. } = op else {
            continue;
        };
        if *stream == StreamId::DEFAULT {
            continue;
        }
        let known = streams.iter().find(|(recorded, _)| recorded == stream);
        *stream = match known {
            Some(&(_, created)) => created,
            None => {
                let created = gpu.create_stream().map_err(fail)?;
                streams.push((*stream, created));
                created
            }
        };
    }
    Ok(Device::Backend(Arc::new(gpu)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_bad_ones_say_what_to_give() {
        assert_eq!(parse("sim"), Ok(Target::Sim));
        assert_eq!(parse("cuda"), Ok(Target::Cuda(0)));
        assert_eq!(parse("cuda:3"), Ok(Target::Cuda(3)));
        for bad in ["gpu", "cuda:", "cuda:-1", "cuda:x", "3"] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains("give sim or cuda:N"), "{bad}: {err}");
        }
        assert_eq!(Target::Cuda(2).to_string(), "cuda:2");
    }
}

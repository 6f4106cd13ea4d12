//! The snapshot pickle that `torch.cuda.memory._dump_snapshot` writes.
//!
//! Its top level is a dict with `segments` (the state when the snapshot was
//! taken), `device_traces` (one list of events per device, each a dict with
//! `action`, `addr`, `size`, `stream`, `time_us` and call-stack `frames`) and
//! `allocator_settings` (the configuration, `PYTORCH_CUDA_ALLOC_CONF` among it).
//! Addresses and stream handles can exceed `i64`, so the pickle is decoded with
//! serde-pickle's value API (big integers kept) and then walked by hand, after
//! [`guard::check`] has bounded the decoded size and depth.

use std::collections::BTreeMap;
use std::io::Read;

use serde_pickle::{DeOptions, HashableValue, Value};

use super::{guard, io_error, Origin, ReadLimits, Recording, TraceError};
use crate::backend::StreamId;
use crate::error::{is_too_large, MAX_REQUEST};
use crate::event::{Action, TraceEvent};
use crate::private_pool::PoolId;
use crate::snapshot::{BlockInfo, BlockState, SegmentInfo};

/// A decoded memory snapshot.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Segments (with their blocks) when the snapshot was taken.
    pub segments: Vec<SegmentInfo>,
    /// Events per device, in recorded order.
    pub device_traces: Vec<Vec<TraceEvent>>,
    /// `allocator_settings.PYTORCH_CUDA_ALLOC_CONF`, when present.
    pub conf: Option<String>,
}

impl Snapshot {
    /// The recording of `device`, or of the one device that has events when
    /// `None` (device 0 when none has).
    ///
    /// # Errors
    /// [`TraceError::Device`] when `device` is `None` and several devices have
    /// events, or when `device` has none.
    pub fn into_recording(self, device: Option<usize>) -> Result<Recording, TraceError> {
        let with_events: Vec<usize> = (0..self.device_traces.len())
            .filter(|d| !self.device_traces[*d].is_empty())
            .collect();
        let device = match (device, &with_events[..]) {
            (Some(d), _) if with_events.contains(&d) => d,
            (Some(d), _) => {
                return Err(TraceError::Device {
                    reason: format!("device {d} has no events in this snapshot"),
                    devices: with_events,
                })
            }
            (None, []) => 0,
            (None, [one]) => *one,
            (None, _) => {
                return Err(TraceError::Device {
                    reason: "a snapshot of several devices, which are replayed one at a time"
                        .into(),
                    devices: with_events,
                })
            }
        };
        let segments = self
            .segments
            .into_iter()
            .filter(|s| s.device == device)
            .collect();
        let events = self
            .device_traces
            .into_iter()
            .nth(device)
            .unwrap_or_default();
        Ok(Recording {
            events,
            segments,
            conf: self.conf,
            origin: Origin::Snapshot { device },
        })
    }
}

/// Reads a snapshot pickle from decompressed input (see [`super::decompressed`]).
///
/// # Errors
/// [`TraceError::Pickle`] for a malformed or hostile pickle (with the byte offset),
/// [`TraceError::Schema`] for a pickle that is not a snapshot, [`TraceError::TooLarge`]
/// past the input limit.
pub fn read_snapshot<R: Read>(mut input: R, limits: &ReadLimits) -> Result<Snapshot, TraceError> {
    let mut bytes = Vec::new();
    if let Err(e) = input.read_to_end(&mut bytes) {
        return Err(match io_error("snapshot pickle", e) {
            TraceError::Io { source, .. } => TraceError::Pickle {
                offset: bytes.len() as u64,
                reason: format!("read failed: {source}"),
            },
            other => other,
        });
    }
    snapshot_from_slice(&bytes, limits)
}

/// Decodes a snapshot pickle held in memory (decompressed).
///
/// # Errors
/// As [`read_snapshot`].
pub fn snapshot_from_slice(bytes: &[u8], limits: &ReadLimits) -> Result<Snapshot, TraceError> {
    if bytes.len() as u64 > limits.max_input_bytes {
        return Err(TraceError::TooLarge {
            what: "decompressed input",
            limit: limits.max_input_bytes,
        });
    }
    guard::check(bytes, limits)?;
    // serde-pickle counts references per memo entry and drops an entry after its
    // last counted use; a memoized value inside a container that is itself
    // referenced several times (the call-stack frames PyTorch shares between
    // events) is used more often than counted, and would fail as "recursive".
    // Replacing those extra uses by None keeps the frames' contents at worst; every
    // field read below must be an integer or string, so a None there is a schema
    // error, never a silent zero.
    let options = DeOptions::new().replace_recursive_structures();
    let value = serde_pickle::value_from_slice(bytes, options).map_err(pickle_error)?;
    snapshot_from_value(&value)
}

fn pickle_error(e: serde_pickle::Error) -> TraceError {
    let (offset, reason) = match e {
        serde_pickle::Error::Eval(code, pos) => (pos as u64, code.to_string()),
        other => (0, other.to_string()),
    };
    TraceError::Pickle { offset, reason }
}

/// Extracts a snapshot from a decoded pickle value.
///
/// # Errors
/// [`TraceError::Schema`] naming the first field with a missing or wrong value.
pub fn snapshot_from_value(value: &Value) -> Result<Snapshot, TraceError> {
    let top = dict(value, "snapshot")?;
    let segments = list(field(top, "segments", "snapshot")?, "segments")?
        .iter()
        .enumerate()
        .map(|(i, s)| segment(s, &format!("segments[{i}]")))
        .collect::<Result<_, _>>()?;
    let device_traces = list(field(top, "device_traces", "snapshot")?, "device_traces")?
        .iter()
        .enumerate()
        .map(|(d, t)| {
            let path = format!("device_traces[{d}]");
            list(t, &path)?
                .iter()
                .enumerate()
                .map(|(i, e)| event(e, &format!("{path}[{i}]")))
                .collect()
        })
        .collect::<Result<_, _>>()?;
    let conf = match get(top, "allocator_settings") {
        None => None,
        Some(settings) => {
            let settings = dict(settings, "allocator_settings")?;
            let path = "allocator_settings.PYTORCH_CUDA_ALLOC_CONF";
            get(settings, "PYTORCH_CUDA_ALLOC_CONF")
                .map(|v| string(v, path).map(str::to_string))
                .transpose()?
        }
    };
    Ok(Snapshot {
        segments,
        device_traces,
        conf,
    })
}

type Dict = BTreeMap<HashableValue, Value>;

fn dict<'a>(value: &'a Value, path: &str) -> Result<&'a Dict, TraceError> {
    match value {
        Value::Dict(d) => Ok(d),
        other => Err(TraceError::schema(
            path,
            format!("expected a dict, found {}", kind(other)),
        )),
    }
}

fn list<'a>(value: &'a Value, path: &str) -> Result<&'a [Value], TraceError> {
    match value {
        Value::List(l) | Value::Tuple(l) => Ok(l),
        other => Err(TraceError::schema(
            path,
            format!("expected a list, found {}", kind(other)),
        )),
    }
}

fn get<'a>(d: &'a Dict, key: &str) -> Option<&'a Value> {
    d.get(&HashableValue::String(key.to_string()))
}

fn field<'a>(d: &'a Dict, key: &str, path: &str) -> Result<&'a Value, TraceError> {
    get(d, key).ok_or_else(|| TraceError::schema(format!("{path}.{key}"), "missing"))
}

fn string<'a>(value: &'a Value, path: &str) -> Result<&'a str, TraceError> {
    match value {
        Value::String(s) => Ok(s),
        other => Err(TraceError::schema(
            path,
            format!("expected a string, found {}", kind(other)),
        )),
    }
}

fn uint(value: &Value, path: &str) -> Result<u64, TraceError> {
    let n = match value {
        Value::I64(i) => u64::try_from(*i).ok(),
        Value::Int(big) => u64::try_from(big).ok(),
        other => {
            return Err(TraceError::schema(
                path,
                format!("expected an integer, found {}", kind(other)),
            ))
        }
    };
    n.ok_or_else(|| TraceError::schema(path, "integer outside 0..2^64"))
}

fn boolean(value: &Value, path: &str) -> Result<bool, TraceError> {
    match value {
        Value::Bool(b) => Ok(*b),
        other => Err(TraceError::schema(
            path,
            format!("expected a bool, found {}", kind(other)),
        )),
    }
}

fn size(value: &Value, path: &str) -> Result<u64, TraceError> {
    let n = uint(value, path)?;
    if is_too_large(n) {
        return Err(TraceError::schema(
            path,
            format!("size {n} is too large (a request must be under {MAX_REQUEST})"),
        ));
    }
    Ok(n)
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::None => "None",
        Value::Bool(_) => "a bool",
        Value::I64(_) | Value::Int(_) => "an integer",
        Value::F64(_) => "a float",
        Value::Bytes(_) => "bytes",
        Value::String(_) => "a string",
        Value::List(_) => "a list",
        Value::Tuple(_) => "a tuple",
        Value::Set(_) | Value::FrozenSet(_) => "a set",
        Value::Dict(_) => "a dict",
    }
}

fn event(value: &Value, path: &str) -> Result<TraceEvent, TraceError> {
    let d = dict(value, path)?;
    let num = |key: &str| uint(field(d, key, path)?, &format!("{path}.{key}"));
    let action_path = format!("{path}.action");
    let action_text = string(field(d, "action", path)?, &action_path)?;
    let action: Action = action_text
        .parse()
        .map_err(|e: String| TraceError::schema(&action_path, e))?;
    Ok(TraceEvent {
        time_us: num("time_us")?,
        action,
        addr: num("addr")?,
        size: size(field(d, "size", path)?, &format!("{path}.size"))?,
        stream: StreamId(num("stream")?),
    })
}

fn segment(value: &Value, path: &str) -> Result<SegmentInfo, TraceError> {
    let d = dict(value, path)?;
    let num = |key: &str| uint(field(d, key, path)?, &format!("{path}.{key}"));
    let type_path = format!("{path}.segment_type");
    let is_small = match string(field(d, "segment_type", path)?, &type_path)? {
        "small" => true,
        "large" => false,
        other => {
            return Err(TraceError::schema(
                type_path,
                format!("unknown segment type '{other}'"),
            ))
        }
    };
    let is_expandable = match get(d, "is_expandable") {
        Some(v) => boolean(v, &format!("{path}.is_expandable"))?,
        None => false,
    };
    let blocks = list(field(d, "blocks", path)?, &format!("{path}.blocks"))?
        .iter()
        .enumerate()
        .map(|(i, b)| block(b, &format!("{path}.blocks[{i}]")))
        .collect::<Result<_, _>>()?;
    Ok(SegmentInfo {
        device: usize::try_from(num("device")?)
            .map_err(|_| TraceError::schema(format!("{path}.device"), "too large"))?,
        address: num("address")?,
        total_size: size(field(d, "total_size", path)?, &format!("{path}.total_size"))?,
        stream: StreamId(num("stream")?),
        is_small,
        is_expandable,
        pool_id: pool_id(d, path)?,
        blocks,
    })
}

/// `segment_pool_id`, a pair of integers; absent in older snapshots.
fn pool_id(d: &Dict, path: &str) -> Result<PoolId, TraceError> {
    let Some(v) = get(d, "segment_pool_id") else {
        return Ok(PoolId::DEFAULT);
    };
    let at = format!("{path}.segment_pool_id");
    match v {
        Value::Tuple(items) | Value::List(items) if items.len() == 2 => {
            Ok(PoolId(uint(&items[0], &at)?, uint(&items[1], &at)?))
        }
        _ => Err(TraceError::schema(at, "expected a pair of integers")),
    }
}

fn block(value: &Value, path: &str) -> Result<BlockInfo, TraceError> {
    let d = dict(value, path)?;
    let state_path = format!("{path}.state");
    let state = match string(field(d, "state", path)?, &state_path)? {
        "active_allocated" => BlockState::ActiveAllocated,
        "active_pending_free" => BlockState::ActivePendingFree,
        "inactive" => BlockState::Inactive,
        other => {
            return Err(TraceError::schema(
                state_path,
                format!("unknown block state '{other}'"),
            ))
        }
    };
    let requested_size = match get(d, "requested_size") {
        Some(v) => size(v, &format!("{path}.requested_size"))?,
        None => 0,
    };
    Ok(BlockInfo {
        address: uint(field(d, "address", path)?, &format!("{path}.address"))?,
        size: size(field(d, "size", path)?, &format!("{path}.size"))?,
        requested_size,
        state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(text: &str) -> HashableValue {
        HashableValue::String(text.to_string())
    }

    fn minimal(addr: Value) -> Value {
        with_size(addr, 512)
    }

    /// A snapshot of one `alloc` of `size` bytes at `addr`.
    fn with_size(addr: Value, size: i64) -> Value {
        let event = Value::Dict(BTreeMap::from([
            (s("action"), Value::String("alloc".into())),
            (s("addr"), addr),
            (s("size"), Value::I64(size)),
            (s("stream"), Value::I64(0)),
            (s("time_us"), Value::I64(1)),
        ]));
        let settings = Value::Dict(BTreeMap::from([(
            s("PYTORCH_CUDA_ALLOC_CONF"),
            Value::String("".into()),
        )]));
        Value::Dict(BTreeMap::from([
            (s("segments"), Value::List(vec![])),
            (
                s("device_traces"),
                Value::List(vec![Value::List(vec![event])]),
            ),
            (s("allocator_settings"), settings),
        ]))
    }

    #[test]
    fn a_snapshot_of_several_devices_needs_one_chosen() {
        let bytes =
            serde_pickle::value_to_vec(&minimal(Value::I64(4096)), serde_pickle::SerOptions::new())
                .unwrap();
        let one = snapshot_from_slice(&bytes, &ReadLimits::default()).unwrap();
        let event = one.device_traces[0][0];
        let two = Snapshot {
            device_traces: vec![vec![event], vec![], vec![event, event]],
            ..one.clone()
        };
        let err = two.clone().into_recording(None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "a snapshot of several devices, which are replayed one at a time; \
             the devices with events are 0 and 2: choose one with --snapshot-device"
        );
        let chosen = two.clone().into_recording(Some(2)).unwrap();
        assert_eq!(chosen.events.len(), 2);
        assert_eq!(chosen.origin, Origin::Snapshot { device: 2 });
        let none = two.into_recording(Some(1)).unwrap_err().to_string();
        assert!(none.starts_with("device 1 has no events"), "{none}");
        assert_eq!(one.into_recording(None).unwrap().events.len(), 1);
    }

    #[test]
    fn big_addresses_survive_a_round_trip() {
        let addr = Value::Int(num_from(u64::MAX));
        let bytes =
            serde_pickle::value_to_vec(&minimal(addr), serde_pickle::SerOptions::new()).unwrap();
        let snap = snapshot_from_slice(&bytes, &ReadLimits::default()).unwrap();
        assert_eq!(snap.device_traces[0][0].addr, u64::MAX);
        assert_eq!(snap.conf.as_deref(), Some(""));
    }

    #[test]
    fn sizes_of_one_exbibyte_or_more_are_refused() {
        let read = |size: u64| snapshot_from_value(&with_size(Value::I64(4096), size as i64));
        let largest = read(MAX_REQUEST - 1).unwrap();
        assert_eq!(largest.device_traces[0][0].size, MAX_REQUEST - 1);
        for size in [MAX_REQUEST, MAX_REQUEST + 1] {
            let err = read(size).unwrap_err().to_string();
            assert!(err.contains(&format!("size {size} is too large")), "{err}");
        }
    }

    fn num_from(n: u64) -> num_bigint::BigInt {
        n.into()
    }

    #[test]
    fn wrong_types_name_the_field() {
        let bad = minimal(Value::String("0x10".into()));
        let err = snapshot_from_value(&bad).unwrap_err();
        assert!(
            err.to_string().contains("device_traces[0][0].addr"),
            "{err}"
        );
        let negative = minimal(Value::I64(-1));
        assert!(snapshot_from_value(&negative).is_err());
        assert!(snapshot_from_value(&Value::List(vec![])).is_err());
    }
}

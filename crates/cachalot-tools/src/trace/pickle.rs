//! The snapshot pickle that `torch.cuda.memory._dump_snapshot` writes.
//!
//! Its top level is a dict with `segments` (the state when the snapshot was
//! taken), `device_traces` (one list of events per device, each a dict with
//! `action`, `addr`, `size`, `stream`, `time_us` and call-stack `frames`) and
//! `allocator_settings` (the configuration, `PYTORCH_CUDA_ALLOC_CONF` among it).
//! The pickle is decoded by `unpickle` (two streaming passes, the events
//! turned into [`TraceEvent`]s as they are read, call stacks dropped) and the
//! result walked by hand here, naming the first field that is not as expected.

use std::rc::Rc;

use super::unpickle::{self, Container, Source, Value};
use super::{Origin, ReadLimits, Recording, TraceError};
use cachalot_core::backend::StreamId;
use cachalot_core::error::{is_too_large, MAX_REQUEST};
use cachalot_core::event::TraceEvent;
use cachalot_core::private_pool::PoolId;
use cachalot_core::snapshot::{BlockInfo, BlockState, SegmentInfo};

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

/// Reads a snapshot pickle from `source` (decompressed input, read twice).
///
/// # Errors
/// [`TraceError::Pickle`] for a malformed or hostile pickle (with the byte offset),
/// [`TraceError::Schema`] for a pickle that is not a snapshot, [`TraceError::TooLarge`]
/// past the input limit.
pub(crate) fn read_snapshot(
    source: &dyn Source,
    limits: &ReadLimits,
) -> Result<Snapshot, TraceError> {
    let value = unpickle::read(source, limits)?;
    snapshot_from_value(&value)
}

/// Decodes a snapshot pickle held in memory (decompressed).
///
/// # Errors
/// As `read_snapshot`.
pub fn snapshot_from_slice(bytes: &[u8], limits: &ReadLimits) -> Result<Snapshot, TraceError> {
    if bytes.len() as u64 > limits.max_input_bytes {
        return Err(TraceError::TooLarge {
            what: "decompressed input",
            limit: limits.max_input_bytes,
        });
    }
    read_snapshot(&bytes, limits)
}

/// Extracts a snapshot from a decoded pickle value.
fn snapshot_from_value(value: &Value) -> Result<Snapshot, TraceError> {
    let top = dict(value, "snapshot")?;
    let segments = list(&field(top, "segments", "snapshot")?, "segments")?
        .items()
        .iter()
        .enumerate()
        .map(|(i, s)| segment(s, &format!("segments[{i}]")))
        .collect::<Result<_, _>>()?;
    let traces = field(top, "device_traces", "snapshot")?;
    let device_traces = list(&traces, "device_traces")?
        .items()
        .iter()
        .enumerate()
        .map(|(d, t)| trace(t, &format!("device_traces[{d}]")))
        .collect::<Result<_, _>>()?;
    let conf = match top.get("allocator_settings") {
        None => None,
        Some(settings) => {
            let settings = dict(&settings, "allocator_settings")?;
            let path = "allocator_settings.PYTORCH_CUDA_ALLOC_CONF";
            settings
                .get("PYTORCH_CUDA_ALLOC_CONF")
                .map(|v| string(&v, path).map(|s| s.to_string()))
                .transpose()?
        }
    };
    Ok(Snapshot {
        segments,
        device_traces,
        conf,
    })
}

/// The events of one device's trace, read as its entries were.
fn trace(value: &Value, path: &str) -> Result<Vec<TraceEvent>, TraceError> {
    let entries = list(value, path)?;
    if let Some(other) = entries.items().first() {
        let at = entries.take_events();
        let index = at.events.len() + at.skipped;
        return Err(TraceError::schema(
            format!("{path}[{index}]"),
            format!(
                "expected a trace entry (a dict with an action), found {}",
                other.kind()
            ),
        ));
    }
    let events = entries.take_events();
    if let Some((index, field, reason)) = events.error {
        return Err(TraceError::schema(
            format!("{path}[{index}].{field}"),
            reason,
        ));
    }
    Ok(events.events)
}

fn dict<'a>(value: &'a Value, path: &str) -> Result<&'a Rc<Container>, TraceError> {
    match value {
        Value::Dict(d) => Ok(d),
        other => Err(TraceError::schema(
            path,
            format!("expected a dict, found {}", other.kind()),
        )),
    }
}

fn list<'a>(value: &'a Value, path: &str) -> Result<&'a Rc<Container>, TraceError> {
    match value {
        Value::List(l) => Ok(l),
        other => Err(TraceError::schema(
            path,
            format!("expected a list, found {}", other.kind()),
        )),
    }
}

fn field(d: &Container, key: &str, path: &str) -> Result<Value, TraceError> {
    d.get(key)
        .ok_or_else(|| TraceError::schema(format!("{path}.{key}"), "missing"))
}

fn string(value: &Value, path: &str) -> Result<Rc<str>, TraceError> {
    match value {
        Value::Str(s) => Ok(s.clone()),
        other => Err(TraceError::schema(
            path,
            format!("expected a string, found {}", other.kind()),
        )),
    }
}

fn uint(value: &Value, path: &str) -> Result<u64, TraceError> {
    unpickle::uint(value).map_err(|reason| TraceError::schema(path, reason))
}

fn boolean(value: &Value, path: &str) -> Result<bool, TraceError> {
    match value {
        Value::Bool(b) => Ok(*b),
        other => Err(TraceError::schema(
            path,
            format!("expected a bool, found {}", other.kind()),
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

fn segment(value: &Value, path: &str) -> Result<SegmentInfo, TraceError> {
    let d = dict(value, path)?;
    let num = |key: &str| uint(&field(d, key, path)?, &format!("{path}.{key}"));
    let type_path = format!("{path}.segment_type");
    let is_small = match &*string(&field(d, "segment_type", path)?, &type_path)? {
        "small" => true,
        "large" => false,
        other => {
            return Err(TraceError::schema(
                type_path,
                format!("unknown segment type '{other}'"),
            ))
        }
    };
    let is_expandable = match d.get("is_expandable") {
        Some(v) => boolean(&v, &format!("{path}.is_expandable"))?,
        None => false,
    };
    let blocks = list(&field(d, "blocks", path)?, &format!("{path}.blocks"))?
        .items()
        .iter()
        .enumerate()
        .map(|(i, b)| block(b, &format!("{path}.blocks[{i}]")))
        .collect::<Result<_, _>>()?;
    Ok(SegmentInfo {
        device: usize::try_from(num("device")?)
            .map_err(|_| TraceError::schema(format!("{path}.device"), "too large"))?,
        address: num("address")?,
        total_size: size(
            &field(d, "total_size", path)?,
            &format!("{path}.total_size"),
        )?,
        stream: StreamId(num("stream")?),
        is_small,
        is_expandable,
        pool_id: pool_id(d, path)?,
        blocks,
    })
}

/// `segment_pool_id`, a pair of integers; absent in older snapshots.
fn pool_id(d: &Container, path: &str) -> Result<PoolId, TraceError> {
    let Some(v) = d.get("segment_pool_id") else {
        return Ok(PoolId::DEFAULT);
    };
    let at = format!("{path}.segment_pool_id");
    match &v {
        Value::List(pair) if pair.items().len() == 2 => {
            let items = pair.items();
            Ok(PoolId(uint(&items[0], &at)?, uint(&items[1], &at)?))
        }
        _ => Err(TraceError::schema(at, "expected a pair of integers")),
    }
}

fn block(value: &Value, path: &str) -> Result<BlockInfo, TraceError> {
    let d = dict(value, path)?;
    let state_path = format!("{path}.state");
    let state = match &*string(&field(d, "state", path)?, &state_path)? {
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
    let requested_size = match d.get("requested_size") {
        Some(v) => size(&v, &format!("{path}.requested_size"))?,
        None => 0,
    };
    Ok(BlockInfo {
        address: uint(&field(d, "address", path)?, &format!("{path}.address"))?,
        size: size(&field(d, "size", path)?, &format!("{path}.size"))?,
        requested_size,
        state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_pickle::{HashableValue, Value as P};
    use std::collections::BTreeMap;

    fn s(text: &str) -> HashableValue {
        HashableValue::String(text.to_string())
    }

    /// A snapshot of one `alloc` of `size` bytes at `addr`, pickled.
    fn with_size(addr: P, size: i64) -> Vec<u8> {
        let event = P::Dict(BTreeMap::from([
            (s("action"), P::String("alloc".into())),
            (s("addr"), addr),
            (s("size"), P::I64(size)),
            (s("stream"), P::I64(0)),
            (s("time_us"), P::I64(1)),
        ]));
        let settings = P::Dict(BTreeMap::from([(
            s("PYTORCH_CUDA_ALLOC_CONF"),
            P::String("".into()),
        )]));
        let top = P::Dict(BTreeMap::from([
            (s("segments"), P::List(vec![])),
            (s("device_traces"), P::List(vec![P::List(vec![event])])),
            (s("allocator_settings"), settings),
        ]));
        serde_pickle::value_to_vec(&top, serde_pickle::SerOptions::new()).expect("pickles")
    }

    fn read(bytes: &[u8]) -> Result<Snapshot, TraceError> {
        snapshot_from_slice(bytes, &ReadLimits::default())
    }

    #[test]
    fn a_snapshot_of_several_devices_needs_one_chosen() {
        let one = read(&with_size(P::I64(4096), 512)).unwrap();
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
        let snap = read(&with_size(P::Int(u64::MAX.into()), 512)).unwrap();
        assert_eq!(snap.device_traces[0][0].addr, u64::MAX);
        assert_eq!(snap.conf.as_deref(), Some(""));
    }

    #[test]
    fn sizes_of_one_exbibyte_or_more_are_refused() {
        let largest = read(&with_size(P::I64(4096), (MAX_REQUEST - 1) as i64)).unwrap();
        assert_eq!(largest.device_traces[0][0].size, MAX_REQUEST - 1);
        for size in [MAX_REQUEST, MAX_REQUEST + 1] {
            let err = read(&with_size(P::I64(4096), size as i64))
                .unwrap_err()
                .to_string();
            assert!(err.contains(&format!("size {size} is too large")), "{err}");
        }
    }

    #[test]
    fn wrong_types_name_the_field() {
        let err = read(&with_size(P::String("0x10".into()), 512)).unwrap_err();
        assert!(
            err.to_string().contains("device_traces[0][0].addr"),
            "{err}"
        );
        assert!(read(&with_size(P::I64(-1), 512)).is_err());
        let list = serde_pickle::value_to_vec(&P::List(vec![]), serde_pickle::SerOptions::new())
            .expect("pickles");
        assert!(read(&list).is_err());
    }
}

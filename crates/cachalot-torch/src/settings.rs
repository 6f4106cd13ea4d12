//! The C entry point of PyTorch's run-time settings: the C++ allocator hears
//! each `torch.cuda.memory._set_allocator_settings` call (it wraps PyTorch's
//! configuration hook) and hands over what PyTorch's parser left in force.

use std::ffi::{c_char, c_int};

use cachalot::config::{PlacementSettings, ROUNDUP_BUCKETS};

use crate::error::PluginError;
use crate::global::registry;
use crate::reply::reply;

/// Power-of-two buckets of `roundup_power2_divisions` in a [`SettingsRow`]
/// (PyTorch's, from 1 MiB), written out for the C header.
pub const ROUNDUP_DIVISIONS: usize = 16;
const _: () = assert!(ROUNDUP_DIVISIONS == ROUNDUP_BUCKETS);

/// PyTorch's device-allocator settings after a change, as its
/// `AcceleratorAllocatorConfig` holds them.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SettingsRow {
    /// `max_split_size_mb` in bytes; `u64::MAX` when unlimited.
    pub max_split_size: u64,
    /// `max_non_split_rounding_mb` in bytes.
    pub max_non_split_rounding: u64,
    /// `roundup_power2_divisions`, per power-of-two bucket from 1 MiB.
    pub roundup_power2_divisions: [u64; ROUNDUP_DIVISIONS],
    /// `garbage_collection_threshold` (0 = off).
    pub garbage_collection_threshold: f64,
    /// `expandable_segments`, 0 or 1.
    pub expandable_segments: u8,
    /// `graph_capture_record_stream_reuse`, 0 or 1.
    pub graph_capture_record_stream_reuse: u8,
}

impl From<&SettingsRow> for PlacementSettings {
    fn from(row: &SettingsRow) -> Self {
        PlacementSettings {
            max_split_size: (row.max_split_size != u64::MAX).then_some(row.max_split_size),
            max_non_split_rounding: row.max_non_split_rounding,
            roundup_power2_divisions: row.roundup_power2_divisions,
            garbage_collection_threshold: row.garbage_collection_threshold,
            expandable_segments: row.expandable_segments != 0,
            graph_capture_record_stream_reuse: row.graph_capture_record_stream_reuse != 0,
        }
    }
}

/// Puts `settings` in force on every device, open now or later.
///
/// # Safety
/// `settings` must be NULL or point to a readable [`SettingsRow`]; `message`
/// must be NULL or point to a writable `char*`.
#[no_mangle]
pub unsafe extern "C" fn cachalot_set_placement_settings(
    settings: *const SettingsRow,
    message: *mut *mut c_char,
) -> c_int {
    reply(message, || {
        // SAFETY: non-null `settings` points to a readable row (the contract).
        let row = unsafe { settings.as_ref() }
            .ok_or_else(|| PluginError::InvalidArgument("settings are NULL".into()))?;
        registry()?.set_placement_settings(&PlacementSettings::from(row));
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_reads_as_pytorch_writes_it() {
        let row = SettingsRow {
            max_split_size: u64::MAX,
            max_non_split_rounding: 20 << 20,
            roundup_power2_divisions: [4; ROUNDUP_BUCKETS],
            garbage_collection_threshold: 0.5,
            expandable_segments: 1,
            graph_capture_record_stream_reuse: 1,
        };
        let s = PlacementSettings::from(&row);
        assert_eq!(s.max_split_size, None);
        assert!(s.expandable_segments);
        assert!(s.graph_capture_record_stream_reuse);
        assert_eq!(s.roundup_power2_divisions[3], 4);
        let row = SettingsRow {
            max_split_size: 40 << 20,
            expandable_segments: 0,
            ..row
        };
        assert_eq!(PlacementSettings::from(&row).max_split_size, Some(40 << 20));
    }
}

//! The C entry points as C sees them, on whatever machine runs the tests.
//!
//! One test only: the entry points share the process's registry and last-error
//! slot. Without a GPU (CI) every allocation fails cleanly with the reason; with
//! one, a small allocation round-trips and shows up in the statistics.

use std::ffi::{c_char, c_void, CStr, CString};

use cachalot::backend::cuda::CudaBackend;
use cachalot_torch::ffi::*;

/// Takes a string the library returned.
fn take(s: *mut c_char) -> Option<String> {
    if s.is_null() {
        return None;
    }
    // SAFETY: a non-null string from the library is NUL-terminated and ours to free.
    let text = unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned();
    // SAFETY: returned by the library and not freed yet.
    unsafe { cachalot_string_free(s) };
    Some(text)
}

fn last_error() -> Option<String> {
    take(cachalot_last_error())
}

#[test]
fn the_c_abi_fails_cleanly_and_never_unwinds() {
    assert_eq!(cachalot_init(), 0, "{:?}", last_error());
    let config = take(cachalot_config()).expect("config");
    assert!(config.contains("\"policy\":\"pytorch\""), "{config}");
    // Nothing in this process intercepts cudaMalloc: segments from the driver.
    assert!(config.contains("\"segments\":\"driver\""), "{config}");

    // Freeing NULL, or asking for nothing, is not an error.
    cachalot_clear_last_error();
    cachalot_free(std::ptr::null_mut(), 0, 0, std::ptr::null_mut());
    // SAFETY: NULL is explicitly allowed.
    unsafe { cachalot_string_free(std::ptr::null_mut()) };
    assert_eq!(last_error(), None);

    // Bad arguments: NULL or -1 and a message, never a panic.
    assert!(cachalot_alloc(-5, 0, std::ptr::null_mut()).is_null());
    assert!(last_error().expect("message").contains("negative size"));
    assert!(cachalot_alloc(16, -1, std::ptr::null_mut()).is_null());
    assert_eq!(last_error().as_deref(), Some("invalid device -1"));
    assert!(take(cachalot_memory_stats(1000)).is_none());
    // SAFETY: NULL is explicitly allowed and reported.
    assert_eq!(unsafe { cachalot_dump_snapshot(std::ptr::null()) }, -1);
    cachalot_record_stream(
        std::ptr::without_provenance_mut::<c_void>(0x1234),
        std::ptr::null_mut(),
    );
    assert!(last_error()
        .expect("message")
        .contains("not allocated by cachalot"));

    if !matches!(CudaBackend::device_count(), Ok(n) if n > 0) {
        // No GPU: opening device 0 fails with the driver's reason.
        assert!(cachalot_alloc(1024, 0, std::ptr::null_mut()).is_null());
        let message = last_error().expect("message");
        assert!(
            message.starts_with("device 0: device failure: no GPU available"),
            "{message}"
        );
        assert!(take(cachalot_memory_stats(0)).is_none());
        return;
    }

    let p = cachalot_alloc(1 << 20, 0, std::ptr::null_mut());
    assert!(!p.is_null(), "{:?}", last_error());
    let stats = take(cachalot_memory_stats(0)).expect("stats");
    assert!(
        stats.contains("\"allocated_bytes.all.current\":1048576"),
        "{stats}"
    );
    cachalot_free(p, 1 << 20, 0, std::ptr::null_mut());
    cachalot_empty_cache();
    assert_eq!(cachalot_validate(0), 0, "{:?}", last_error());
    let summary = take(cachalot_memory_summary(0, 0)).expect("summary");
    assert!(summary.contains("Allocated memory"), "{summary}");
    let path = std::env::temp_dir().join(format!("cachalot-ffi-{}.pickle", std::process::id()));
    let c_path = CString::new(path.to_string_lossy().as_bytes()).expect("no NUL in a temp path");
    assert_eq!(cachalot_record_history(1, 0), 0);
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(
        unsafe { cachalot_dump_snapshot(c_path.as_ptr()) },
        0,
        "{:?}",
        last_error()
    );
    assert!(std::fs::metadata(&path)
        .map(|m| m.len() > 0)
        .unwrap_or(false));
    let _ = std::fs::remove_file(&path);
}

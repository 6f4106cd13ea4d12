//! The contracts every [`Backend`] keeps (`backend/mod.rs`), as checks any
//! backend or adaptor stack runs: segments, virtual memory, copies, events
//! and streams, and misuse answered with an error that leaves the backend as
//! it was. [`backend_suite!`](crate::backend_suite) makes one test per check.

use cachalot::backend::host::{ToDevice, ToHost};
use cachalot::backend::{Backend, BackendError, StreamId};

const MIB: u64 = 1 << 20;

/// Free bytes now.
fn free(b: &dyn Backend) -> u64 {
    b.mem_info().expect("mem_info").free
}

/// Segments: no overlap, free falls by at least their sizes and comes back,
/// and a second free, or a free of an address that is no segment's base, is
/// `InvalidAddress` and changes nothing.
pub fn segments_do_not_overlap_and_free_once(b: &dyn Backend) {
    let before = free(b);
    let (sa, sb) = (3 * MIB + 512, 8 * MIB);
    let a = b.allocate_segment(sa).expect("segment a");
    let c = b.allocate_segment(sb).expect("segment b");
    assert!(
        a + sa <= c || c + sb <= a,
        "segments {a:#x} and {c:#x} overlap"
    );
    assert!(
        before - free(b) >= sa + sb,
        "free fell by less than the segments"
    );
    let inside = b.free_segment(a + 512).unwrap_err();
    assert!(
        matches!(inside, BackendError::InvalidAddress { .. }),
        "{inside}"
    );
    b.free_segment(a).expect("free a");
    let twice = b.free_segment(a).unwrap_err();
    assert!(
        matches!(twice, BackendError::InvalidAddress { .. }),
        "{twice}"
    );
    b.free_segment(c).expect("free b");
    assert_eq!(free(b), before, "free back where it was");
}

/// Virtual memory: pages mapped in a reserved range hold bytes across page
/// boundaries; a page still mapped cannot be released, a range still mapped
/// cannot be released, a misaligned map is refused; without virtual memory
/// every such call is `Unsupported`.
pub fn pages_map_into_ranges_and_go_back_in_order(b: &dyn Backend) {
    let caps = b.capabilities().clone();
    if !caps.virtual_memory {
        let e = b.reserve_range(64 * MIB).unwrap_err();
        assert!(matches!(e, BackendError::Unsupported { .. }), "{e}");
        let e = b.create_page(2 * MIB).unwrap_err();
        assert!(matches!(e, BackendError::Unsupported { .. }), "{e}");
        return;
    }
    let g = caps.granularity;
    let before = free(b);
    let base = b.reserve_range(4 * g).expect("range");
    let (p0, p1) = (
        b.create_page(g).expect("page"),
        b.create_page(g).expect("page"),
    );
    assert!(b.map(base + 1, p0).is_err(), "a misaligned map is refused");
    b.map(base, p0).expect("map 0");
    b.map(base + g, p1).expect("map 1");
    let bytes: Vec<u8> = (0..2 * MIB).map(|i| (i % 251) as u8).collect();
    let at = base + g - MIB; // across the two pages
    b.upload(&[ToDevice {
        src: &bytes,
        dst: at,
    }])
    .expect("upload");
    let mut back = vec![0u8; bytes.len()];
    b.download(&mut [ToHost {
        src: at,
        dst: &mut back,
    }])
    .expect("download");
    assert!(
        back == bytes,
        "the bytes came back across the page boundary"
    );
    assert!(b.release_page(p0).is_err(), "a mapped page cannot go back");
    assert!(
        b.release_range(base, 4 * g).is_err(),
        "a mapped range cannot go back"
    );
    b.unmap(base, 2 * g).expect("unmap both");
    b.release_page(p0).expect("release 0");
    b.release_page(p1).expect("release 1");
    b.release_range(base, 4 * g).expect("release range");
    assert_eq!(free(b), before, "free back where it was");
}

/// Copies: bytes uploaded to a segment from the backend's host memory come
/// back the same.
pub fn copies_round_trip_through_host_memory(b: &dyn Backend) {
    let size = MIB + 4096;
    let dev = b.allocate_segment(size).expect("segment");
    let mut host = b.allocate_host(size).expect("host memory");
    for (i, byte) in host.bytes_mut().iter_mut().enumerate() {
        *byte = (i % 253) as u8;
    }
    b.upload(&[ToDevice {
        src: host.bytes(),
        dst: dev,
    }])
    .expect("upload");
    let mut back = vec![0u8; size as usize];
    b.download(&mut [ToHost {
        src: dev,
        dst: &mut back,
    }])
    .expect("download");
    assert!(back == host.bytes(), "the bytes came back");
    b.free_segment(dev).expect("free");
}

/// Events and streams: an event recorded on the default stream completes
/// once synchronized; a destroyed event is no longer known; synchronizing a
/// stream and the device works; a stream that is not capturing has no
/// capture frontier.
pub fn events_complete_and_streams_synchronize(b: &dyn Backend) {
    let e = b.create_event().expect("event");
    b.record_event(e, StreamId::DEFAULT).expect("record");
    b.synchronize_event(e).expect("synchronize event");
    assert!(
        b.query_event(e).expect("query"),
        "complete after a synchronize"
    );
    b.synchronize_stream(StreamId::DEFAULT)
        .expect("synchronize stream");
    b.synchronize_device().expect("synchronize device");
    b.destroy_event(e).expect("destroy");
    assert!(b.query_event(e).is_err(), "a destroyed event is unknown");
    assert!(b.destroy_event(e).is_err(), "destroyed twice");
    assert_eq!(
        b.capture_frontier(StreamId::DEFAULT).expect("capture info"),
        None,
        "the default stream is not capturing"
    );
    assert!(
        !b.capture_follows(StreamId::DEFAULT, &[])
            .expect("capture info"),
        "a stream that is not capturing follows nothing"
    );
}

/// Misuse of pages and ranges that are not live is an error, and the
/// backend's free memory is unchanged by it.
pub fn unknown_handles_are_errors(b: &dyn Backend) {
    let before = free(b);
    assert!(b.free_segment(0xdead_0000).is_err());
    if b.capabilities().virtual_memory {
        let g = b.capabilities().granularity;
        assert!(b.unmap(0xdead_0000, g).is_err(), "nothing is mapped there");
        assert!(b.release_range(0xdead_0000, g).is_err(), "no such range");
    }
    assert_eq!(free(b), before);
}

/// Generates one test per contract check for the backend `$make` builds (a
/// closure returning `Arc<dyn Backend>`, a fresh one per call).
#[macro_export]
macro_rules! backend_suite {
    ($name:ident, $make:expr) => {
        mod $name {
            use super::*;

            fn make() -> std::sync::Arc<dyn cachalot::backend::Backend> {
                ($make)()
            }

            #[test]
            fn segments_do_not_overlap_and_free_once() {
                $crate::backend::segments_do_not_overlap_and_free_once(&*make());
            }
            #[test]
            fn pages_map_into_ranges_and_go_back_in_order() {
                $crate::backend::pages_map_into_ranges_and_go_back_in_order(&*make());
            }
            #[test]
            fn copies_round_trip_through_host_memory() {
                $crate::backend::copies_round_trip_through_host_memory(&*make());
            }
            #[test]
            fn events_complete_and_streams_synchronize() {
                $crate::backend::events_complete_and_streams_synchronize(&*make());
            }
            #[test]
            fn unknown_handles_are_errors() {
                $crate::backend::unknown_handles_are_errors(&*make());
            }
        }
    };
}

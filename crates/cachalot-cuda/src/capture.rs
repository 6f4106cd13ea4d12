//! Reading a stream capture's graph: the frontier a capturing stream's next
//! work depends on (`cuStreamGetCaptureInfo`), and whether given nodes are in
//! it or among its ancestors (a walk up `cuGraphNodeGetDependencies`).

use std::collections::HashSet;

use cudarc::driver::sys::{self, CUstreamCaptureStatus};

use super::driver::check;
use cachalot_core::backend::{BackendResult, CallKind, GraphNode};

const CALL: CallKind = CallKind::CaptureInfo;

/// The nodes `stream`'s next captured work will depend on, or `None` when it
/// is not capturing (or its capture was invalidated).
///
/// # Safety
/// `stream` is a live stream of the current context.
pub(super) unsafe fn frontier(
    stream: sys::CUstream,
) -> BackendResult<Option<Vec<sys::CUgraphNode>>> {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: sys::cuuint64_t = 0;
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    let mut deps: *const sys::CUgraphNode = std::ptr::null();
    let mut edges: *const sys::CUgraphEdgeData = std::ptr::null();
    let mut count: usize = 0;
    // SAFETY: the caller vouches for the stream; every out-pointer is a live
    // local; the driver points `deps` at an array of `count` nodes that stays
    // valid until the next call on this stream, copied out below before any.
    check(CALL, 0, || unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            stream,
            &mut status,
            &mut id,
            &mut graph,
            &mut deps,
            &mut edges,
            &mut count,
        )
    })?;
    if status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
        return Ok(None);
    }
    if count == 0 || deps.is_null() {
        return Ok(Some(Vec::new()));
    }
    // SAFETY: on success with an active capture the driver wrote `count` nodes at
    // `deps` (checked non-null above).
    let nodes = unsafe { std::slice::from_raw_parts(deps, count) };
    Ok(Some(nodes.to_vec()))
}

/// Whether every node of `marks` is in `start` or an ancestor of a node there.
///
/// # Safety
/// The nodes of `start` belong to a graph under capture that lives during the
/// call.
pub(super) unsafe fn reaches(
    start: Vec<sys::CUgraphNode>,
    marks: &[GraphNode],
) -> BackendResult<bool> {
    let mut left: HashSet<u64> = marks.iter().map(|m| m.0).collect();
    let mut seen: HashSet<u64> = HashSet::new();
    let mut stack = start;
    while let Some(node) = stack.pop() {
        if left.is_empty() {
            break;
        }
        let key = node as usize as u64;
        if !seen.insert(key) {
            continue;
        }
        left.remove(&key);
        // SAFETY: `node` came from the capture's frontier or from a walk up its
        // edges, so it is a node of the live graph (the caller's contract).
        stack.extend(unsafe { dependencies(node)? });
    }
    Ok(left.is_empty())
}

/// The nodes `node` depends on.
///
/// # Safety
/// `node` is a node of a live graph.
unsafe fn dependencies(node: sys::CUgraphNode) -> BackendResult<Vec<sys::CUgraphNode>> {
    let mut count: usize = 0;
    // SAFETY: with null arrays the driver only writes the count.
    check(CALL, 0, || unsafe {
        sys::cuGraphNodeGetDependencies_v2(
            node,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut count,
        )
    })?;
    if count == 0 {
        return Ok(Vec::new());
    }
    let mut deps: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); count];
    // SAFETY: zeroed edge data is the driver's default edge, a plain value type.
    let mut edges: Vec<sys::CUgraphEdgeData> = vec![unsafe { std::mem::zeroed() }; count];
    let mut got = count;
    // SAFETY: both arrays hold `got` entries, as the driver is told.
    check(CALL, 0, || unsafe {
        sys::cuGraphNodeGetDependencies_v2(node, deps.as_mut_ptr(), edges.as_mut_ptr(), &mut got)
    })?;
    deps.truncate(got.min(count));
    Ok(deps)
}

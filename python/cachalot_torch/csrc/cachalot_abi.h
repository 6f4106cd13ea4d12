// The cachalot library's C ABI (libcachalot_torch.so, crates/cachalot-torch):
// status 0 ok, 1 out of memory, 2 any other failure with the reason in
// *message (freed with cachalot_string_free).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include <cuda_runtime_api.h>

extern "C" {
struct cachalot_oom_info {
  int64_t device;
  uint64_t allocated;
  uint64_t device_total;
  uint64_t device_free;
};
struct cachalot_segment_row {
  int64_t device;
  uint64_t address, total_size, requested_size, allocated_size, active_size;
  uint64_t stream;
  uint8_t is_large, is_expandable;
  size_t first_block, block_count;
  uint64_t pool_id[2];
};
struct cachalot_block_row {
  uint64_t address, size, requested_size;
  uint8_t allocated, active;
};
struct cachalot_trace_row {
  int64_t device;
  uint32_t action;
  uint64_t addr, size, stream, time_unix_us, tag;
};
struct cachalot_snapshot {
  const cachalot_segment_row* segments;
  size_t segment_count;
  const cachalot_block_row* blocks;
  size_t block_count;
  const cachalot_trace_row* trace;
  size_t trace_count;
};
// PyTorch's device-allocator settings after a change (settings.rs).
struct cachalot_settings {
  uint64_t max_split_size;  // UINT64_MAX: unlimited
  uint64_t max_non_split_rounding;
  uint64_t roundup_power2_divisions[16];
  double garbage_collection_threshold;
  uint8_t expandable_segments;
  uint8_t graph_capture_record_stream_reuse;
};
struct cachalot_pool_allocation {
  uint64_t ptr, size, requested, stream;
};

int cachalot_init();
char* cachalot_config();
void cachalot_string_free(char*);
char* cachalot_last_error();
int cachalot_malloc(size_t, int, void*, void**, char**, cachalot_oom_info*);
int cachalot_free_any(void*, char**);
int cachalot_record_stream_to(void*, void*, char**);
int cachalot_release_cache(char**);
int cachalot_limit_fraction(double, int, char**);
int cachalot_device_stats(int, int64_t*, size_t, char**);
int cachalot_reset_peaks(int, char**);
int cachalot_reset_totals(int, char**);
int cachalot_largest_free_block(int, size_t*, char**);
int cachalot_segment_of(void*, void**, size_t*, char**);
int cachalot_set_history(int, size_t, uint32_t, int, char**);
void cachalot_set_event_tag(uint64_t);
int cachalot_set_placement_settings(const cachalot_settings*, char**);
cachalot_snapshot* cachalot_snapshot_take(char**);
void cachalot_snapshot_free(cachalot_snapshot*);
int cachalot_pool_begin(int, uint64_t, uint64_t, int (*)(void*, void*), void (*)(void*), void*, char**);
int cachalot_pool_end(int, uint64_t, uint64_t, char**);
int cachalot_pool_create(int, uint64_t, uint64_t, char**);
int cachalot_pool_release(int, uint64_t, uint64_t, char**);
int cachalot_pool_set_source(
    int,
    uint64_t,
    uint64_t,
    void* (*)(void*, size_t),
    int (*)(void*, void*, size_t),
    void (*)(void*),
    void*,
    char**);
int cachalot_pool_use_count(int, uint64_t, uint64_t, int*, char**);
int cachalot_pool_set_option(int, uint64_t, uint64_t, int, int, char**);
int cachalot_pool_empty(uint64_t, uint64_t, char**);
int cachalot_pool_allocations(int, uint64_t, uint64_t, cachalot_pool_allocation*, size_t, size_t*, char**);
int cachalot_pool_restore(int, uint64_t, uint64_t, const cachalot_pool_allocation*, size_t, char**);
int cachalot_ipc_share(void*, uint8_t*, size_t, size_t*, uint64_t*, char**);
int cachalot_ipc_open(int, const uint8_t*, size_t, void**, char**);
int cachalot_ipc_close(void*, char**);
int cachalot_stream_hash(int, void*, uint64_t, char**);

// A route's filter, owned here and called back by the library with the
// stream of each request while the route is open.
struct cachalot_route {
  std::function<bool(cudaStream_t)> filter;
};
static int cachalot_route_accepts(void* ctx, void* stream) noexcept {
  try {
    return static_cast<cachalot_route*>(ctx)->filter(static_cast<cudaStream_t>(stream)) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}
static void cachalot_route_drop(void* ctx) noexcept {
  delete static_cast<cachalot_route*>(ctx);
}
}

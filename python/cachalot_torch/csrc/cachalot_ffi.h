// The cachalot library's C ABI (libcachalot_torch.so, crates/cachalot-torch):
// status 0 ok, 1 out of memory, 2 any other failure with the reason in
// *message (freed with cachalot_string_free).

#ifndef CACHALOT_FFI_H
#define CACHALOT_FFI_H

// Generated from crates/cachalot-torch by cbindgen (tests/c_header.rs): do not edit.
// CACHALOT_BLESS=1 cargo test -p cachalot-torch --test c_header writes it again.

#include <stddef.h>
#include <stdint.h>

#define CACHALOT_STATS_LEN (((((9 * 3) * 4) + (2 * 4)) + 5) + 1)

#define CACHALOT_STATS_ALLOCATED_NOW (4 * 12)

#define CACHALOT_STATS_RESERVED_NOW (5 * 12)

#define CACHALOT_OK 0

#define CACHALOT_FAILED -1

#define CACHALOT_OPTION_USE_ON_OOM 0

#define CACHALOT_OPTION_NO_SPLIT 1

#define CACHALOT_OOM 1

#define CACHALOT_ERROR 2

#define CACHALOT_ROUNDUP_DIVISIONS 16

struct cachalot_oom_info {
  int64_t device;
  uint64_t allocated;
  uint64_t device_total;
  uint64_t device_free;
};

struct cachalot_segment_row {
  int64_t device;
  uint64_t address;
  uint64_t total_size;
  uint64_t requested_size;
  uint64_t allocated_size;
  uint64_t active_size;
  uint64_t stream;
  uint8_t is_large;
  uint8_t is_expandable;
  size_t first_block;
  size_t block_count;
  uint64_t pool_id[2];
};

struct cachalot_block_row {
  uint64_t address;
  uint64_t size;
  uint64_t requested_size;
  uint8_t allocated;
  uint8_t active;
};

struct cachalot_trace_row {
  int64_t device;
  uint32_t action;
  uint64_t addr;
  uint64_t size;
  uint64_t stream;
  uint64_t time_unix_us;
  uint64_t tag;
};

struct cachalot_snapshot {
  const struct cachalot_segment_row *segments;
  size_t segment_count;
  const struct cachalot_block_row *blocks;
  size_t block_count;
  const struct cachalot_trace_row *trace;
  size_t trace_count;
};

typedef int (*cachalot_route_accepts_fn)(void *ctx, void *stream);

typedef void (*cachalot_drop_fn)(void *ctx);

typedef void *(*cachalot_source_allocate_fn)(void *ctx, size_t size);

typedef int (*cachalot_source_free_fn)(void *ctx, void *ptr, size_t size);

struct cachalot_pool_allocation {
  uint64_t ptr;
  uint64_t size;
  uint64_t requested;
  uint64_t stream;
};

struct cachalot_settings {
  uint64_t max_split_size;
  uint64_t max_non_split_rounding;
  uint64_t roundup_power2_divisions[CACHALOT_ROUNDUP_DIVISIONS];
  double garbage_collection_threshold;
  uint8_t expandable_segments;
  uint8_t graph_capture_record_stream_reuse;
};

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

int cachalot_malloc(size_t size,
                    int device,
                    void *stream,
                    void **out,
                    char **message,
                    struct cachalot_oom_info *oom);

int cachalot_free_any(void *ptr, char **message);

int cachalot_record_stream_to(void *ptr, void *stream, char **message);

int cachalot_release_cache(char **message);

int cachalot_limit_fraction(double fraction, int device, char **message);

int cachalot_device_stats(int device, int64_t *out, size_t len, char **message);

int cachalot_reset_peaks(int device, char **message);

int cachalot_reset_totals(int device, char **message);

int cachalot_largest_free_block(int device, size_t *largest, char **message);

int cachalot_segment_of(void *ptr, void **base, size_t *size, char **message);

int cachalot_set_history(int enabled,
                         size_t max_entries,
                         const char *const *skip,
                         size_t skip_count,
                         int clear,
                         char **message);

struct cachalot_snapshot *cachalot_snapshot_take(char **message);

void cachalot_snapshot_free(struct cachalot_snapshot *snapshot);

int cachalot_stream_hash(int device, void *stream, uint64_t hash, char **message);

int cachalot_init(void);

void *cachalot_alloc(ptrdiff_t size, int device, void *stream);

void cachalot_free(void *ptr, ptrdiff_t size, int device, void *stream);

void cachalot_record_stream(void *ptr, void *stream);

void cachalot_empty_cache(void);

void cachalot_set_memory_fraction(double fraction, int device);

char *cachalot_memory_stats(int device);

char *cachalot_memory_summary(int device, int abbreviated);

char *cachalot_config(void);

int cachalot_reset_peak_stats(int device);

int cachalot_reset_accumulated_stats(int device);

int cachalot_validate(int device);

int cachalot_record_history(int enabled, size_t max_entries);

int cachalot_dump_snapshot(const char *path);

char *cachalot_last_error(void);

void cachalot_clear_last_error(void);

void cachalot_string_free(char *s);

int cachalot_ipc_share(void *ptr,
                       uint8_t *out,
                       size_t capacity,
                       size_t *len,
                       uint64_t *offset,
                       char **message);

int cachalot_ipc_open(int device, const uint8_t *handle, size_t len, void **out, char **message);

int cachalot_ipc_close(void *ptr, char **message);

int cachalot_pool_begin(int device,
                        uint64_t a,
                        uint64_t b,
                        cachalot_route_accepts_fn accepts,
                        cachalot_drop_fn drop,
                        void *ctx,
                        char **message);

int cachalot_pool_end(int device, uint64_t a, uint64_t b, char **message);

int cachalot_pool_create(int device, uint64_t a, uint64_t b, char **message);

int cachalot_pool_set_source(int device,
                             uint64_t a,
                             uint64_t b,
                             cachalot_source_allocate_fn allocate,
                             cachalot_source_free_fn free,
                             cachalot_drop_fn drop,
                             void *ctx,
                             char **message);

int cachalot_pool_release(int device, uint64_t a, uint64_t b, char **message);

int cachalot_pool_use_count(int device, uint64_t a, uint64_t b, int *count, char **message);

int cachalot_pool_set_option(int device,
                             uint64_t a,
                             uint64_t b,
                             int option,
                             int value,
                             char **message);

int cachalot_pool_empty(uint64_t a, uint64_t b, char **message);

int cachalot_pool_allocations(int device,
                              uint64_t a,
                              uint64_t b,
                              struct cachalot_pool_allocation *out,
                              size_t capacity,
                              size_t *count,
                              char **message);

int cachalot_pool_restore(int device,
                          uint64_t a,
                          uint64_t b,
                          const struct cachalot_pool_allocation *rows,
                          size_t n,
                          char **message);

int cachalot_tag_add(const char *name, int device, uint64_t a, uint64_t b, int backup_code);

char *cachalot_tag_pause(const char *name, int synchronize);

char *cachalot_tag_resume(const char *name);

char *cachalot_tags(void);

int cachalot_set_placement_settings(const struct cachalot_settings *settings, char **message);

void cachalot_set_event_tag(uint64_t tag);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* CACHALOT_FFI_H */

// cachalot as PyTorch's CUDA allocator, with nothing lost.
//
// A subclass of c10::cuda::CUDACachingAllocator::CUDAAllocator, the interface
// PyTorch's own caching allocator implements, answered by the cachalot library
// through its C ABI (crates/cachalot-torch/src/dropin.rs). Installed with
// torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator, it serves every
// CUDA tensor, and torch.cuda's memory functions (memory_stats, memory_summary,
// _record_memory_history, _snapshot, empty_cache, ...) read it as they read
// PyTorch's own. Compiled against the user's torch on first use
// (cachalot_torch/_extension.py). docs/torch-plugin.md lists every method.

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <torch/extension.h>

#include <atomic>
#include <cstdio>
#include <cstdint>
#include <deque>
#include <functional>
#include <unordered_set>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

extern "C" {
// The cachalot library's C ABI (libcachalot_torch.so); status 0 ok, 1 out of
// memory, 2 any other failure with the reason in *message.
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
  uint64_t addr, size, stream, time_unix_us;
};
struct cachalot_snapshot {
  const cachalot_segment_row* segments;
  size_t segment_count;
  const cachalot_block_row* blocks;
  size_t block_count;
  const cachalot_trace_row* trace;
  size_t trace_count;
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
cachalot_snapshot* cachalot_snapshot_take(char**);
void cachalot_snapshot_free(cachalot_snapshot*);
int cachalot_pool_begin(int, uint64_t, uint64_t, int (*)(void*, void*), void (*)(void*), void*, char**);
int cachalot_pool_end(int, uint64_t, uint64_t, char**);
int cachalot_pool_create(int, uint64_t, uint64_t, char**);
int cachalot_pool_release(int, uint64_t, uint64_t, char**);
int cachalot_pool_use_count(int, uint64_t, uint64_t, int*, char**);
int cachalot_pool_set_option(int, uint64_t, uint64_t, int, int, char**);
int cachalot_pool_empty(int, uint64_t, uint64_t, char**);
struct cachalot_pool_allocation {
  uint64_t ptr, size, requested, stream;
};
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

namespace cachalot {

using c10::MempoolId_t;
using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::RecordContext;
using c10::CachingDeviceAllocator::TraceEntry;
namespace cca = c10::cuda::CUDACachingAllocator;

constexpr int kOk = 0;
constexpr int kOom = 1;
// cachalot_pool_set_option's options (OPTION_* in pools.rs).
constexpr int kUseOnOom = 0;
constexpr int kNoSplit = 1;
constexpr size_t kStatsLen = 9 * 3 * 4 + 2 * 4 + 5 + 1;

// Takes a message the library allocated.
std::string take(char* message) {
  if (message == nullptr) {
    return "no reason given";
  }
  std::string text(message);
  cachalot_string_free(message);
  return text;
}

// Raises a RuntimeError naming cachalot for a failed status. Takes the
// message's address, read only after the call that set it (an argument
// `message` would be read in an unspecified order with the call's).
void check(int status, char** message, const char* what) {
  if (status != kOk) {
    TORCH_CHECK(false, "cachalot: ", what, ": ", take(*message));
  }
}

[[noreturn]] void unsupported(const char* what) {
  TORCH_CHECK(
      false,
      "cachalot does not support ",
      what,
      " yet. Run this program on PyTorch's own allocator meanwhile.");
}

// A private pool's state at a checkpoint: its live allocations.
struct PoolCheckpoint : cca::AllocatorState {
  MempoolId_t pool{0, 0};
  std::vector<cachalot_pool_allocation> live;
};

bool is_default(MempoolId_t id) {
  return id.first == 0 && id.second == 0;
}

// Lets the driver calls of an allocation run while a stream is captured in
// cudaStreamCaptureModeGlobal (as PyTorch does around cudaMalloc): the
// thread's capture mode is relaxed for the guard's life.
class RelaxedCapture {
 public:
  explicit RelaxedCapture(bool on) : on_(on) {
    if (on_) {
      (void)cudaThreadExchangeStreamCaptureMode(&mode_);
    }
  }
  ~RelaxedCapture() {
    if (on_) {
      (void)cudaThreadExchangeStreamCaptureMode(&mode_);
    }
  }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  bool on_;
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

void deleter(void* ptr);

// Event times: the library stamps microseconds since the Unix epoch; PyTorch's
// trace entries hold c10's approximate clock, which the snapshot converts back.
struct ClockMap {
  c10::ApproximateClockToUnixTimeConverter::UnixAndApproximateTimePair start =
      c10::ApproximateClockToUnixTimeConverter::measurePair();

  c10::approx_time_t to_approx(uint64_t unix_us) const {
    auto now = c10::ApproximateClockToUnixTimeConverter::measurePair();
    double span_ns = double(now.t_ - start.t_);
    double ticks_per_ns =
        span_ns > 0 ? double(now.approx_t_ - start.approx_t_) / span_ns : 1.0;
    double back_ns = double(now.t_) - double(unix_us) * 1000.0;
    return static_cast<c10::approx_time_t>(
        double(now.approx_t_) - back_ns * ticks_per_ns);
  }
};

// The Python stacks PyTorch's context recorder gathers while history is on:
// kept by address for live blocks and, in order, for the trace's events.
class Contexts {
 public:
  using Ctx = std::shared_ptr<c10::GatheredContext>;

  void configure(
      bool enabled,
      cca::CreateContextFn recorder,
      RecordContext when,
      size_t max_entries,
      bool clear) {
    std::lock_guard<std::mutex> lock(mu_);
    recorder_ = enabled ? recorder : nullptr;
    when_ = enabled ? when : RecordContext::NEVER;
    max_entries_ = max_entries;
    if (clear || !enabled) {
      allocs_.clear();
      frees_.clear();
    }
    if (!enabled) {
      live_.clear();
    }
    active_.store(recorder_ != nullptr && when_ != RecordContext::NEVER);
  }

  bool active() const {
    return active_.load(std::memory_order_relaxed);
  }

  void on_alloc(void* ptr) {
    if (!active() || ptr == nullptr) {
      return;
    }
    Ctx ctx = gather();
    std::lock_guard<std::mutex> lock(mu_);
    live_[ptr] = ctx;
    if (when_ >= RecordContext::ALLOC) {
      push(allocs_, ptr, ctx);
    }
  }

  void on_free(void* ptr) {
    if (!active() || ptr == nullptr) {
      return;
    }
    Ctx ctx = when_ == RecordContext::ALL ? gather() : nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(ptr);
    if (ctx) {
      push(frees_, ptr, ctx);
    }
  }

  Ctx of_block(uint64_t address) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(reinterpret_cast<void*>(address));
    return it == live_.end() ? nullptr : it->second;
  }

  // Stacks for the trace's alloc and free_requested events, matched newest
  // first by address (both lists keep the same order per address).
  std::vector<Ctx> of_trace(const cachalot_trace_row* rows, size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Ctx> out(n);
    auto by_addr = [](const std::deque<std::pair<void*, Ctx>>& list) {
      std::unordered_map<void*, std::vector<Ctx>> m;
      for (const auto& [ptr, ctx] : list) {
        m[ptr].push_back(ctx);
      }
      return m;
    };
    auto allocs = by_addr(allocs_);
    auto frees = by_addr(frees_);
    for (size_t i = n; i-- > 0;) {
      auto* m = rows[i].action == TraceEntry::ALLOC ? &allocs
          : rows[i].action == TraceEntry::FREE_REQUESTED ? &frees
                                                          : nullptr;
      if (m == nullptr) {
        continue;
      }
      auto it = m->find(reinterpret_cast<void*>(rows[i].addr));
      if (it != m->end() && !it->second.empty()) {
        out[i] = it->second.back();
        it->second.pop_back();
      }
    }
    return out;
  }

 private:
  Ctx gather() {
    cca::CreateContextFn recorder;
    {
      std::lock_guard<std::mutex> lock(mu_);
      recorder = recorder_;
    }
    return recorder ? recorder() : nullptr;
  }

  void push(std::deque<std::pair<void*, Ctx>>& list, void* ptr, Ctx ctx) {
    list.emplace_back(ptr, std::move(ctx));
    if (max_entries_ > 0 && list.size() > max_entries_) {
      list.pop_front();
    }
  }

  std::mutex mu_;
  std::atomic<bool> active_{false};
  cca::CreateContextFn recorder_ = nullptr;
  RecordContext when_ = RecordContext::NEVER;
  size_t max_entries_ = 0;
  std::unordered_map<void*, Ctx> live_;
  std::deque<std::pair<void*, Ctx>> allocs_, frees_;
};

class CachalotAllocator final : public cca::CUDAAllocator {
 public:
  // --- allocation ---------------------------------------------------------
  c10::DataPtr allocate(size_t nbytes) override {
    c10::DeviceIndex device = c10::cuda::current_device();
    void* ptr = nbytes == 0 ? nullptr : malloc_on(nbytes, device, current_stream(device));
    return {ptr, ptr, &deleter, c10::Device(c10::DeviceType::CUDA, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &deleter;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

  void* raw_alloc(size_t nbytes) override {
    if (nbytes == 0) {
      return nullptr;
    }
    c10::DeviceIndex device = c10::cuda::current_device();
    return malloc_on(nbytes, device, current_stream(device));
  }

  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    if (nbytes == 0) {
      return nullptr;
    }
    return malloc_on(nbytes, c10::cuda::current_device(), stream);
  }

  void raw_delete(void* ptr) override {
    free_ptr(ptr, /*raise=*/true);
  }

  void free_ptr(void* ptr, bool raise) {
    if (ptr == nullptr) {
      return;
    }
    contexts_.on_free(ptr);
    // Asked only when tracked: at exit, with CUDA going away, asking throws.
    if (has_trackers_.load(std::memory_order_relaxed)) {
      track(TraceEntry::FREE_REQUESTED, c10::cuda::current_device(), ptr, 0, nullptr);
    }
    char* message = nullptr;
    if (cachalot_free_any(ptr, &message) != kOk) {
      std::string text = take(message);
      if (raise) {
        TORCH_CHECK(false, "cachalot: free: ", text);
      }
      TORCH_WARN("cachalot: free: ", text);
      return;
    }
    if (!enabled_.load(std::memory_order_relaxed)) {
      char* ignored = nullptr;
      if (cachalot_release_cache(&ignored) != kOk) {
        TORCH_WARN("cachalot: empty_cache after a free: ", take(ignored));
      }
    }
  }

  // --- set-up ---------------------------------------------------------------
  bool initialized() override {
    return device_count_.load() > 0;
  }

  void init(int device_count) override {
    char* message = nullptr;
    int status = cachalot_init();
    if (status != kOk) {
      message = cachalot_last_error();
      check(2, &message, "init");
    }
    std::lock_guard<std::mutex> lock(mu_);
    fractions_.assign(std::max(device_count, 0), 1.0);
    device_count_.store(std::max(device_count, 1));
  }

  std::string name() override {
    return "cachalot";
  }

  void enable(bool value) override {
    enabled_.store(value);
  }

  bool isEnabled() const override {
    return enabled_.load();
  }

  // --- statistics -----------------------------------------------------------
  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    int64_t n[kStatsLen];
    char* message = nullptr;
    check(cachalot_device_stats(device, n, kStatsLen, &message), &message, "memory_stats");
    DeviceStats s;
    const int64_t* p = n;
    auto stat = [&p](c10::CachingAllocator::Stat& st) {
      st.current = p[0];
      st.peak = p[1];
      st.allocated = p[2];
      st.freed = p[3];
      p += 4;
    };
    for (auto* array :
         {&s.allocation,
          &s.segment,
          &s.active,
          &s.inactive_split,
          &s.allocated_bytes,
          &s.reserved_bytes,
          &s.active_bytes,
          &s.inactive_split_bytes,
          &s.requested_bytes}) {
      for (auto& st : *array) {
        stat(st);
      }
    }
    stat(s.oversize_allocations);
    stat(s.oversize_segments);
    s.num_alloc_retries = p[0];
    s.num_ooms = p[1];
    s.num_sync_all_streams = p[2];
    s.num_device_alloc = p[3];
    s.num_device_free = p[4];
    s.max_split_size = p[5];
    return s;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    char* message = nullptr;
    check(cachalot_reset_totals(device, &message), &message, "reset_accumulated_memory_stats");
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    char* message = nullptr;
    check(cachalot_reset_peaks(device, &message), &message, "reset_peak_memory_stats");
  }

  // --- the cache --------------------------------------------------------------
  void emptyCache(MempoolId_t mempool_id) override {
    char* message = nullptr;
    if (!is_default(mempool_id)) {
      int device = c10::cuda::current_device();
      check(
          cachalot_pool_empty(device, mempool_id.first, mempool_id.second, &message),
          &message,
          "empty_cache of a private pool");
      return;
    }
    check(cachalot_release_cache(&message), &message, "empty_cache");
  }

  void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override {
    if (*largestBlock == 0) {
      // As PyTorch's own: with no guess given, start from the device's free memory.
      c10::cuda::CUDAGuard guard(device);
      size_t free_bytes = 0, total = 0;
      C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
      *largestBlock = free_bytes;
    }
    size_t cached = 0;
    char* message = nullptr;
    check(cachalot_largest_free_block(device, &cached, &message), &message, "cacheInfo");
    *largestBlock = std::max(*largestBlock, cached);
  }

  void* getBaseAllocation(void* ptr, size_t* size) override {
    void* base = nullptr;
    size_t segment_size = 0;
    char* message = nullptr;
    check(cachalot_segment_of(ptr, &base, &segment_size, &message), &message, "getBaseAllocation");
    if (size != nullptr) {
      *size = segment_size;
    }
    return base;
  }

  double getMemoryFraction(c10::DeviceIndex device) override {
    std::lock_guard<std::mutex> lock(mu_);
    return device >= 0 && size_t(device) < fractions_.size() ? fractions_[device] : 1.0;
  }

  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    char* message = nullptr;
    check(cachalot_limit_fraction(fraction, device, &message), &message, "set_per_process_memory_fraction");
    std::lock_guard<std::mutex> lock(mu_);
    if (device >= 0) {
      if (size_t(device) >= fractions_.size()) {
        fractions_.resize(device + 1, 1.0);
      }
      fractions_[device] = fraction;
    }
  }

  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(
      c10::DeviceIndex device) override {
    std::vector<cca::StreamSegmentSize> out;
    with_snapshot([&](const cachalot_snapshot& s) {
      for (size_t i = 0; i < s.segment_count; ++i) {
        const auto& seg = s.segments[i];
        if (seg.device == device && seg.is_expandable) {
          out.emplace_back(
              reinterpret_cast<cudaStream_t>(seg.stream), !seg.is_large, seg.total_size);
        }
      }
    });
    return out;
  }

  // --- streams ----------------------------------------------------------------
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    // Only blocks this allocator handed out (not IPC or foreign storages).
    if (ptr.get() == nullptr || ptr.get_deleter() != &deleter) {
      return;
    }
    note_stream(stream.device_index(), stream);
    char* message = nullptr;
    check(
        cachalot_record_stream_to(ptr.get(), stream.stream(), &message),
        &message,
        "record_stream");
  }

  // --- history and snapshots ----------------------------------------------------
  void recordHistory(
      bool enabled,
      cca::CreateContextFn context_recorder,
      size_t alloc_trace_max_entries,
      RecordContext when,
      bool clearHistory,
      const std::vector<std::string>& skip_actions) override {
    static const char* kActions[] = {
        "alloc",
        "free_requested",
        "free_completed",
        "segment_alloc",
        "segment_free",
        "segment_map",
        "segment_unmap",
        "snapshot",
        "oom"};
    uint32_t mask = 0;
    for (const auto& name : skip_actions) {
      bool known = false;
      for (uint32_t i = 0; i < 9; ++i) {
        if (name == kActions[i]) {
          mask |= 1u << i;
          known = true;
        }
      }
      TORCH_CHECK(known, "cachalot: unknown trace action to skip: ", name);
    }
    char* message = nullptr;
    check(
        cachalot_set_history(enabled ? 1 : 0, alloc_trace_max_entries, mask, clearHistory ? 1 : 0, &message),
        &message,
        "_record_memory_history");
    contexts_.configure(enabled, context_recorder, when, alloc_trace_max_entries, clearHistory);
    history_on_.store(enabled);
  }

  bool isHistoryEnabled() override {
    return history_on_.load();
  }

  cca::SnapshotInfo snapshot(MempoolId_t mempool_id, bool include_traces) override {
    cca::SnapshotInfo info;
    with_snapshot([&](const cachalot_snapshot& s) {
      for (size_t i = 0; i < s.segment_count; ++i) {
        const auto& row = s.segments[i];
        bool wanted = is_default(mempool_id) ||
            (row.pool_id[0] == mempool_id.first && row.pool_id[1] == mempool_id.second);
        if (wanted) {
          info.segments.push_back(segment_info(s, row));
        }
      }
      int devices = std::max(device_count_.load(), 1);
      info.device_traces.resize(devices);
      if (!include_traces) {
        return;
      }
      auto contexts = contexts_.of_trace(s.trace, s.trace_count);
      for (size_t i = 0; i < s.trace_count; ++i) {
        const auto& row = s.trace[i];
        if (row.device < 0) {
          continue;
        }
        if (size_t(row.device) >= info.device_traces.size()) {
          info.device_traces.resize(row.device + 1);
        }
        info.device_traces[row.device].emplace_back(
            static_cast<TraceEntry::Action>(row.action),
            static_cast<c10::DeviceIndex>(row.device),
            row.addr,
            row.size,
            reinterpret_cast<void*>(row.stream),
            MempoolId_t{0, 0},
            clock_.to_approx(row.time_unix_us),
            contexts[i]);
      }
    });
    info.config_metadata = config_info();
    return info;
  }

  // --- out of memory and trackers -------------------------------------------------
  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> lock(mu_);
    oom_observers_.push_back(std::move(observer));
  }

  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) override {
    std::lock_guard<std::mutex> lock(mu_);
    trackers_.push_back(std::move(tracker));
    has_trackers_.store(true);
  }

  // --- peers and copies --------------------------------------------------------
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    c10::cuda::CUDAGuard guard(dev);
    cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
    } else {
      C10_CUDA_CHECK(err);
    }
  }

  cudaError_t memcpyAsync(
      void* dst,
      int dstDevice,
      const void* src,
      int srcDevice,
      size_t count,
      cudaStream_t stream,
      bool p2p_enabled) override {
    if (p2p_enabled || dstDevice == srcDevice) {
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    }
    return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
  }

  // --- private pools: CUDA graphs, MemPool ------------------------------------
  void beginAllocateToPool(
      c10::DeviceIndex device,
      MempoolId_t id,
      std::function<bool(cudaStream_t)> filter) override {
    auto* route = new cachalot_route{std::move(filter)};
    char* message = nullptr;
    // The library owns the route from here on, and drops it on failure too.
    int status = cachalot_pool_begin(
        device, id.first, id.second, &cachalot_route_accepts, &cachalot_route_drop, route, &message);
    check(status, &message, "beginAllocateToPool");
    routes_.fetch_add(1);
  }

  void endAllocateToPool(c10::DeviceIndex device, MempoolId_t id) override {
    char* message = nullptr;
    check(cachalot_pool_end(device, id.first, id.second, &message), &message, "endAllocateToPool");
    routes_.fetch_sub(1);
  }

  void releasePool(c10::DeviceIndex device, MempoolId_t id) override {
    char* message = nullptr;
    check(cachalot_pool_release(device, id.first, id.second, &message), &message, "releasePool");
  }

  int getPoolUseCount(c10::DeviceIndex device, MempoolId_t id) override {
    int count = 0;
    char* message = nullptr;
    check(
        cachalot_pool_use_count(device, id.first, id.second, &count, &message),
        &message,
        "getPoolUseCount");
    return count;
  }

  void createOrIncrefPool(
      c10::DeviceIndex device,
      MempoolId_t id,
      std::shared_ptr<cca::CUDAAllocator> allocator) override {
    if (allocator) {
      unsupported("a MemPool with an allocator of its own (MemPool(allocator=...))");
    }
    char* message = nullptr;
    check(cachalot_pool_create(device, id.first, id.second, &message), &message, "createOrIncrefPool");
  }

  void setUseOnOOM(c10::DeviceIndex device, MempoolId_t id, bool use_on_oom) override {
    set_option(device, id, kUseOnOom, use_on_oom);
  }

  void setNoSplit(c10::DeviceIndex device, MempoolId_t id) override {
    set_option(device, id, kNoSplit, true);
  }

  bool checkPoolLiveAllocations(
      c10::DeviceIndex device,
      MempoolId_t id,
      const std::unordered_set<void*>& expected_live_allocations) override {
    std::vector<cachalot_pool_allocation> live = pool_allocations(device, id);
    if (live.size() != expected_live_allocations.size()) {
      return false;
    }
    for (const auto& a : live) {
      if (expected_live_allocations.count(reinterpret_cast<void*>(a.ptr)) == 0) {
        return false;
      }
    }
    return true;
  }

  // cudagraph trees take a checkpoint of their pool after every recording, and
  // restore one when a recording starts part-way down a replayed path.
  std::shared_ptr<cca::AllocatorState> getCheckpointState(
      c10::DeviceIndex device, MempoolId_t id) override {
    auto state = std::make_shared<PoolCheckpoint>();
    state->pool = id;
    state->live = pool_allocations(device, id);
    return state;
  }

  cca::CheckpointDelta setCheckpointPoolState(
      c10::DeviceIndex device, std::shared_ptr<cca::AllocatorState> state) override {
    auto* checkpoint = dynamic_cast<PoolCheckpoint*>(state.get());
    TORCH_CHECK(checkpoint != nullptr, "cachalot: setCheckpointPoolState: a checkpoint cachalot did not take");
    MempoolId_t pool = checkpoint->pool;
    std::vector<cachalot_pool_allocation> before = pool_allocations(device, pool);
    char* message = nullptr;
    check(
        cachalot_pool_restore(
            device, pool.first, pool.second, checkpoint->live.data(), checkpoint->live.size(), &message),
        &message,
        "setCheckpointPoolState");
    cca::CheckpointDelta delta;
    for (const auto& a : before) {
      void* ptr = reinterpret_cast<void*>(a.ptr);
      contexts_.on_free(ptr);
      delta.ptrs_freed.push_back(ptr);
    }
    for (const auto& a : checkpoint->live) {
      void* ptr = reinterpret_cast<void*>(a.ptr);
      contexts_.on_alloc(ptr);
      delta.dataptrs_allocd.emplace_back(ptr, ptr, &deleter, c10::Device(c10::DeviceType::CUDA, device));
    }
    return delta;
  }

  // --- sharing with other processes (torch.multiprocessing) -------------------
  // A segment travels as PyTorch's own handle; pages as file descriptors handed
  // over a socket (cachalot::ipc).
  cca::ShareableHandle shareIpcHandle(void* ptr) override {
    std::string handle(512, '\0');
    size_t len = 0;
    uint64_t offset = 0;
    char* message = nullptr;
    check(
        cachalot_ipc_share(
            ptr, reinterpret_cast<uint8_t*>(handle.data()), handle.size(), &len, &offset, &message),
        &message,
        "shareIpcHandle");
    handle.resize(len);
    return cca::ShareableHandle{static_cast<ptrdiff_t>(offset), std::move(handle)};
  }

  std::shared_ptr<void> getIpcDevPtr(std::string handle) override {
    void* base = nullptr;
    char* message = nullptr;
    check(
        cachalot_ipc_open(
            c10::cuda::current_device(),
            reinterpret_cast<const uint8_t*>(handle.data()),
            handle.size(),
            &base,
            &message),
        &message,
        "getIpcDevPtr");
    return std::shared_ptr<void>(base, [](void* p) {
      char* why = nullptr;
      if (cachalot_ipc_close(p, &why) != kOk) {
        TORCH_WARN("cachalot: closing memory of another process: ", take(why));
      }
    });
  }

 private:
  void set_option(c10::DeviceIndex device, MempoolId_t id, int option, bool value) {
    char* message = nullptr;
    check(
        cachalot_pool_set_option(device, id.first, id.second, option, value ? 1 : 0, &message),
        &message,
        "MemPool option");
  }

  std::vector<cachalot_pool_allocation> pool_allocations(c10::DeviceIndex device, MempoolId_t id) {
    std::vector<cachalot_pool_allocation> out;
    size_t count = 0;
    for (;;) {
      char* message = nullptr;
      check(
          cachalot_pool_allocations(
              device, id.first, id.second, out.data(), out.size(), &count, &message),
          &message,
          "checkPoolLiveAllocations");
      if (count <= out.size()) {
        out.resize(count);
        return out;
      }
      out.resize(count);
    }
  }

  // The current stream of `device`, its hash told to cachalot first.
  cudaStream_t current_stream(c10::DeviceIndex device) {
    c10::cuda::CUDAStream s = c10::cuda::getCurrentCUDAStream(device);
    note_stream(device, s);
    return s.stream();
  }

  // PyTorch's hash of a stream orders its tables of streams; the pytorch
  // policy walks its own in that order (cachalot_stream_hash), told once per
  // stream. Most calls find the thread's last stream and return at once.
  void note_stream(c10::DeviceIndex device, const c10::cuda::CUDAStream& s) {
    thread_local cudaStream_t last = nullptr;
    thread_local int last_device = -1;
    cudaStream_t raw = s.stream();
    if (raw == last && device == last_device) {
      return;
    }
    last = raw;
    last_device = device;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!hashed_.insert({device, raw}).second) {
        return;
      }
    }
    char* message = nullptr;
    uint64_t hash = std::hash<c10::cuda::CUDAStream>{}(s);
    check(cachalot_stream_hash(device, raw, hash, &message), &message, "stream hash");
  }

  void* malloc_on(size_t nbytes, c10::DeviceIndex device, cudaStream_t stream) {
    void* ptr = nullptr;
    char* message = nullptr;
    cachalot_oom_info oom{};
    int status;
    {
      RelaxedCapture relaxed(routes_.load(std::memory_order_relaxed) > 0);
      status = cachalot_malloc(nbytes, device, stream, &ptr, &message, &oom);
    }
    if (status == kOom) {
      std::string text = take(message);
      notify_oom(oom);
      TORCH_CHECK_WITH(OutOfMemoryError, false, text);
    }
    check(status, &message, "allocation");
    contexts_.on_alloc(ptr);
    track(TraceEntry::ALLOC, device, ptr, nbytes, stream);
    return ptr;
  }

  void notify_oom(const cachalot_oom_info& oom) {
    std::vector<cca::OutOfMemoryObserver> observers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      observers = oom_observers_;
    }
    for (auto& observer : observers) {
      observer(oom.device, oom.allocated, oom.device_total, oom.device_free);
    }
  }

  void track(TraceEntry::Action action, c10::DeviceIndex device, void* ptr, size_t size, cudaStream_t stream) {
    if (!has_trackers_.load(std::memory_order_relaxed)) {
      return;
    }
    std::vector<cca::AllocatorTraceTracker> trackers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      trackers = trackers_;
    }
    TraceEntry entry(
        action,
        device,
        reinterpret_cast<size_t>(ptr),
        size,
        stream,
        MempoolId_t{0, 0},
        c10::getApproximateTime());
    for (auto& tracker : trackers) {
      tracker(entry);
    }
  }

  template <typename F>
  void with_snapshot(F&& f) {
    char* message = nullptr;
    cachalot_snapshot* s = cachalot_snapshot_take(&message);
    if (s == nullptr) {
      check(2, &message, "snapshot");
    }
    try {
      f(*s);
    } catch (...) {
      cachalot_snapshot_free(s);
      throw;
    }
    cachalot_snapshot_free(s);
  }

  c10::CachingDeviceAllocator::SegmentInfo segment_info(
      const cachalot_snapshot& s, const cachalot_segment_row& row) {
    c10::CachingDeviceAllocator::SegmentInfo seg;
    seg.device = static_cast<c10::DeviceIndex>(row.device);
    seg.address = row.address;
    seg.total_size = row.total_size;
    seg.requested_size = row.requested_size;
    seg.allocated_size = row.allocated_size;
    seg.active_size = row.active_size;
    seg.stream = reinterpret_cast<void*>(row.stream);
    seg.is_large = row.is_large != 0;
    seg.is_expandable = row.is_expandable != 0;
    seg.owner_private_pool_id = MempoolId_t{row.pool_id[0], row.pool_id[1]};
    for (size_t b = 0; b < row.block_count; ++b) {
      const auto& block = s.blocks[row.first_block + b];
      c10::CachingDeviceAllocator::BlockInfo info;
      info.size = block.size;
      info.requested_size = block.requested_size;
      info.allocated = block.allocated != 0;
      info.active = block.active != 0;
      if (info.active) {
        info.context_when_allocated = contexts_.of_block(block.address);
      }
      seg.blocks.push_back(std::move(info));
    }
    if (!seg.blocks.empty()) {
      seg.context_when_allocated = seg.blocks.front().context_when_allocated;
    }
    return seg;
  }

  cca::AllocatorConfigInfo config_info() {
    cca::AllocatorConfigInfo info{};
    info.garbage_collection_threshold = 0.0;
    info.max_split_size = getDeviceStats(c10::cuda::current_device()).max_split_size;
    char* config = cachalot_config();
    info.last_allocator_settings = config == nullptr ? "" : take(config);
    return info;
  }

  std::mutex mu_;
  std::set<std::pair<int, cudaStream_t>> hashed_;  // streams whose hash cachalot knows
  std::atomic<int> device_count_{0};
  std::atomic<bool> enabled_{true};
  std::atomic<bool> history_on_{false};
  std::atomic<bool> has_trackers_{false};
  std::atomic<int> routes_{0};
  std::vector<double> fractions_;
  std::vector<cca::OutOfMemoryObserver> oom_observers_;
  std::vector<cca::AllocatorTraceTracker> trackers_;
  Contexts contexts_;
  ClockMap clock_;
};

std::shared_ptr<CachalotAllocator>& instance() {
  static std::shared_ptr<CachalotAllocator> the;
  return the;
}

void deleter(void* ptr) {
  if (auto& a = instance()) {
    // PyTorch's deleters must not throw: a tensor freed while the process
    // exits (CUDA already going away) would end it with std::terminate.
    try {
      a->free_ptr(ptr, /*raise=*/false);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cachalot: free at %p: %s\n", ptr, e.what());
    }
  }
}

// Makes cachalot PyTorch's CUDA allocator. PyTorch refuses once its own
// allocator is initialized (CUDA was initialized in this process).
void install() {
  if (instance()) {
    return;
  }
  cca::CUDAAllocator* current = cca::get();
  TORCH_CHECK(
      current == nullptr || !current->initialized(),
      "cachalot_torch.use() must run before PyTorch initializes CUDA in this "
      "process (before the first CUDA tensor, torch.cuda.init(), "
      "torch.cuda.current_device() or torch.cuda.memory_stats()): PyTorch's "
      "allocator (",
      current == nullptr ? std::string("none") : current->name(),
      ") is already in use.");
  auto allocator = std::make_shared<CachalotAllocator>();
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
  instance() = allocator;
}

bool installed() {
  return instance() != nullptr && cca::get() == instance().get();
}

} // namespace cachalot

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "cachalot as PyTorch's CUDA allocator (a CUDAAllocator subclass)";
  m.def("install", &cachalot::install, "Make cachalot PyTorch's CUDA allocator");
  m.def("installed", &cachalot::installed, "Whether cachalot serves CUDA allocations");
}

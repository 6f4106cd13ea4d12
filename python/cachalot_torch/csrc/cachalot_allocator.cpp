// cachalot as PyTorch's CUDA allocator, with nothing lost.
//
// A subclass of c10::cuda::CUDACachingAllocator::CUDAAllocator, the interface
// PyTorch's own caching allocator implements, answered by the cachalot library
// through its C ABI (crates/cachalot-torch/src/dropin.rs). Installed with
// torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator, it serves every
// CUDA tensor, and torch.cuda's memory functions (memory_stats, memory_summary,
// _record_memory_history, _snapshot, empty_cache, ...) read it as they read
// PyTorch's own. A plain shared library with a C entry point (no Python in
// it, so one build serves every Python of a torch version): shipped prebuilt
// for the torch the wheel names, compiled against any other torch on first
// use (cachalot_torch/_extension.py). docs/torch-plugin.md lists every method.

#include <c10/core/Allocator.h>
#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cachalot_abi.h"
#include "history.h"
#include "uncached.h"

namespace cachalot {

using c10::MempoolId_t;
using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::RecordContext;
using c10::CachingDeviceAllocator::TraceEntry;
namespace cca = c10::cuda::CUDACachingAllocator;

// The library's statuses, options and statistics' layout (cachalot_ffi.h).
constexpr int kOk = CACHALOT_OK;
constexpr int kOom = CACHALOT_OOM;
constexpr int kUseOnOom = CACHALOT_OPTION_USE_ON_OOM;
constexpr int kNoSplit = CACHALOT_OPTION_NO_SPLIT;
constexpr size_t kStatsLen = CACHALOT_STATS_LEN;
constexpr size_t kAllocatedNow = CACHALOT_STATS_ALLOCATED_NOW;
constexpr size_t kReservedNow = CACHALOT_STATS_RESERVED_NOW;

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

// A MemPool's own allocator (MemPool(allocator=...)), which gives the pool's
// segments: the library calls it back for them, and releases it once the
// pool and its last segment are gone (until then it outlives the Python
// object, as in PyTorch).
struct PoolSource {
  std::shared_ptr<cca::CUDAAllocator> allocator;

  static void* allocate(void* ctx, size_t size) noexcept {
    try {
      return static_cast<PoolSource*>(ctx)->allocator->raw_alloc(size);
    } catch (...) {
      return nullptr;
    }
  }
  static int free(void* ctx, void* ptr, size_t) noexcept {
    try {
      static_cast<PoolSource*>(ctx)->allocator->raw_delete(ptr);
      return 0;
    } catch (...) {
      return 1;
    }
  }
  static void drop(void* ctx) noexcept {
    delete static_cast<PoolSource*>(ctx);
  }
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
    if (ptr == nullptr || uncached_.free(ptr)) {
      return;
    }
    history_.on_free(ptr);
    // Asked only when tracked: at exit, with CUDA going away, asking throws.
    if (has_trackers_.load(std::memory_order_relaxed)) {
      track(TraceEntry::FREE_REQUESTED, c10::cuda::current_device(), ptr, 0, nullptr);
    }
    report_free(ptr);
    char* message = nullptr;
    int status;
    {
      TaggedCall tag(history_, CallKind::Other);
      status = cachalot_free_any(ptr, &message);
    }
    if (status != kOk) {
      std::string text = take(message);
      if (raise) {
        TORCH_CHECK(false, "cachalot: free: ", text);
      }
      TORCH_WARN("cachalot: free: ", text);
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
    // PyTorch's own parse of its settings (it raises for a bad value).
    double fraction = c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig::per_process_memory_fraction();
    std::lock_guard<std::mutex> lock(mu_);
    fractions_.assign(std::max(device_count, 0), fraction);
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
      TaggedCall tag(history_, CallKind::Other);
      check(
          cachalot_pool_empty(mempool_id.first, mempool_id.second, &message),
          &message,
          "empty_cache of a private pool");
      return;
    }
    TaggedCall tag(history_, CallKind::Other);
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
    std::vector<const char*> skip;
    for (const auto& name : skip_actions) {
      skip.push_back(name.c_str());
    }
    char* message = nullptr;
    check(
        cachalot_set_history(
            enabled ? 1 : 0, alloc_trace_max_entries, skip.data(), skip.size(), clearHistory ? 1 : 0, &message),
        &message,
        "_record_memory_history");
    history_.configure(enabled, context_recorder, when, alloc_trace_max_entries, clearHistory);
  }

  bool isHistoryEnabled() override {
    return history_.active();
  }

  void pushCompileContext(std::string& md) override {
    history_.push_compile_context(md);
  }

  void popCompileContext() override {
    history_.pop_compile_context();
  }

  void setUserMetadata(const std::string& metadata) override {
    history_.set_user_metadata(metadata);
  }

  std::string getUserMetadata() override {
    return history_.user_metadata();
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
      std::vector<EventTag> tags = history_.resolve(s.trace, s.trace_count);
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
            std::move(tags[i].context),
            std::move(tags[i].compile_context),
            std::move(tags[i].user_metadata));
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
    TaggedCall tag(history_, CallKind::Other);
    char* message = nullptr;
    check(cachalot_pool_end(device, id.first, id.second, &message), &message, "endAllocateToPool");
    routes_.fetch_sub(1);
  }

  void releasePool(c10::DeviceIndex device, MempoolId_t id) override {
    TaggedCall tag(history_, CallKind::Other);
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
    char* message = nullptr;
    check(cachalot_pool_create(device, id.first, id.second, &message), &message, "createOrIncrefPool");
    if (allocator) {
      // The library owns the source from here on, and drops it on failure too.
      auto* source = new PoolSource{std::move(allocator)};
      int status = cachalot_pool_set_source(
          device, id.first, id.second, &PoolSource::allocate, &PoolSource::free, &PoolSource::drop, source, &message);
      if (status != kOk) {
        char* ignored = nullptr;
        if (cachalot_pool_release(device, id.first, id.second, &ignored) != kOk) {
          take(ignored);
        }
        check(status, &message, "MemPool(allocator=...)");
      }
    }
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
    TaggedCall tag(history_, CallKind::Alloc);
    char* message = nullptr;
    check(
        cachalot_pool_restore(
            device, pool.first, pool.second, checkpoint->live.data(), checkpoint->live.size(), &message),
        &message,
        "setCheckpointPoolState");
    cca::CheckpointDelta delta;
    for (const auto& a : before) {
      void* ptr = reinterpret_cast<void*>(a.ptr);
      history_.on_free(ptr);
      delta.ptrs_freed.push_back(ptr);
    }
    for (const auto& a : checkpoint->live) {
      void* ptr = reinterpret_cast<void*>(a.ptr);
      history_.on_alloc(ptr, tag.context());
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
    if (!enabled_.load(std::memory_order_relaxed)) {
      return uncached_.malloc(nbytes, device);
    }
    void* ptr = nullptr;
    char* message = nullptr;
    cachalot_oom_info oom{};
    int status;
    TaggedCall tag(history_, CallKind::Alloc);
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
    history_.on_alloc(ptr, tag.context());
    track(TraceEntry::ALLOC, device, ptr, nbytes, stream);
    report_alloc(ptr, nbytes, device);
    return ptr;
  }

  // PyTorch's profiler (profile_memory=True) hears of every allocation and
  // free with the device's totals, as from PyTorch's own allocator. The sizes
  // of blocks handed out while it listens are kept to report their frees.
  void report_alloc(void* ptr, size_t nbytes, c10::DeviceIndex device) {
    if (!c10::memoryProfilingEnabled()) {
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      profiled_[ptr] = {nbytes, device};
      has_profiled_.store(true);
    }
    report_usage(ptr, static_cast<int64_t>(nbytes), device);
  }

  void report_free(void* ptr) {
    if (!has_profiled_.load(std::memory_order_relaxed)) {
      return;
    }
    std::pair<size_t, c10::DeviceIndex> block;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = profiled_.find(ptr);
      if (it == profiled_.end()) {
        return;
      }
      block = it->second;
      profiled_.erase(it);
      has_profiled_.store(!profiled_.empty());
    }
    report_usage(ptr, -static_cast<int64_t>(block.first), block.second);
  }

  void report_usage(void* ptr, int64_t delta, c10::DeviceIndex device) {
    int64_t n[kStatsLen];
    char* message = nullptr;
    if (cachalot_device_stats(device, n, kStatsLen, &message) != kOk) {
      take(message);
      return;
    }
    c10::reportMemoryUsageToProfiler(
        ptr, delta, n[kAllocatedNow], n[kReservedNow], c10::Device(c10::DeviceType::CUDA, device));
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
        info.context_when_allocated = history_.of_block(block.address);
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
  std::atomic<bool> has_profiled_{false};
  std::unordered_map<void*, std::pair<size_t, c10::DeviceIndex>> profiled_;  // blocks the profiler heard of
  UncachedAllocations uncached_;
  std::atomic<bool> has_trackers_{false};
  std::atomic<int> routes_{0};
  std::vector<double> fractions_;
  std::vector<cca::OutOfMemoryObserver> oom_observers_;
  std::vector<cca::AllocatorTraceTracker> trackers_;
  History history_;
  ClockMap clock_;
};

// The allocator lives until the process ends and is never destroyed, as
// PyTorch's own is: a reference held here is never dropped. Destroying it at
// exit would free the Python tracebacks its history keeps after the
// interpreter is gone ("double free or corruption" after the last test).
std::shared_ptr<CachalotAllocator>& instance() {
  static auto* the = new std::shared_ptr<CachalotAllocator>();
  return *the;
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

// Hands PyTorch's device-allocator settings, as its parser left them, to
// the library.
void pass_settings() {
  using Config = c10::CachingAllocator::AcceleratorAllocatorConfig;
  cachalot_settings row{};
  size_t split = Config::max_split_size();
  row.max_split_size = split == std::numeric_limits<size_t>::max() ? UINT64_MAX : split;
  row.max_non_split_rounding = Config::max_non_split_rounding_size();
  const std::vector<size_t>& divisions = Config::roundup_power2_divisions();
  for (size_t i = 0; i < 16 && i < divisions.size(); ++i) {
    row.roundup_power2_divisions[i] = divisions[i];
  }
  row.garbage_collection_threshold = Config::garbage_collection_threshold();
  row.expandable_segments = Config::use_expandable_segments() ? 1 : 0;
  row.graph_capture_record_stream_reuse =
      c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig::graph_capture_record_stream_reuse() ? 1 : 0;
  char* message = nullptr;
  check(cachalot_set_placement_settings(&row, &message), &message, "_set_allocator_settings");
}

// PyTorch calls its configuration hook after each change of its settings at
// run time (torch.cuda.memory._set_allocator_settings): cachalot wraps it, so
// the change reaches its devices too, from their next call on.
void follow_settings() {
  auto& hook = c10::CachingAllocator::AcceleratorAllocatorConfig::getConfigParserHook();
  std::function<void(const std::string&)> previous = hook;
  hook = [previous](const std::string& env) {
    if (previous) {
      previous(env);
    }
    pass_settings();
  };
}

// Makes cachalot PyTorch's CUDA allocator, for torch.cuda's functions and for
// torch.accelerator's (which ask c10's table of allocators by device type).
// PyTorch refuses once its own allocator is initialized (CUDA was initialized
// in this process).
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
  c10::SetAllocator(c10::DeviceType::CUDA, allocator.get(), /*priority=*/UINT8_MAX);
  instance() = allocator;
  follow_settings();
}

bool installed() {
  return instance() != nullptr && cca::get() == instance().get();
}

} // namespace cachalot

// The C entry points cachalot_torch/_extension.py calls through ctypes.
// cachalot_allocator_install returns NULL on success, else PyTorch's reason,
// valid until the thread's next call.
extern "C" {

const char* cachalot_allocator_install() {
  static thread_local std::string reason;
  try {
    cachalot::install();
    return nullptr;
  } catch (const c10::Error& e) {
    reason = e.what_without_backtrace();
    return reason.c_str();
  } catch (const std::exception& e) {
    reason = e.what();
    return reason.c_str();
  }
}

int cachalot_allocator_installed() {
  return cachalot::installed() ? 1 : 0;
}

} // extern "C"

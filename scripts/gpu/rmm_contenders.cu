// RMM (RAPIDS Memory Manager 26.10, from the librmm-cu13 wheel) as contenders
// of cachalot's native bench, behind contender.h's interface:
//
//   rmm:pool   rmm::mr::pool_memory_resource over cuda_memory_resource: RMM's
//              coalescing best-fit suballocator, per-stream free lists ordered
//              by CUDA events.
//   rmm:arena  rmm::mr::arena_memory_resource over cuda_memory_resource: one
//              global arena taken from the device when it is made, handed out
//              to per-stream arenas in superblocks.
//   rmm:async  rmm::mr::cuda_async_memory_resource: cudaMallocAsync on a pool
//              of its own, kept (release threshold at its maximum, RMM's
//              default), like the bench's own "async" contender.
//
// RMM 26 resources follow CCCL's cuda::mr concepts: a resource is a shared
// handle (cuda::mr::shared_resource) with allocate(cuda::stream_ref, bytes,
// alignment) and deallocate(cuda::stream_ref, ptr, bytes, alignment); the
// deallocation needs the size, which the replay passes in. RMM's headers need
// C++20 and CCCL 3.3 or newer (RMM brings its own, include/rapids), so this file
// is compiled by nvcc with RMM's include folders first and includes no torch
// header. native_bench.py compiles it into the extension only where the RMM
// wheels are present, with CACHALOT_WITH_RMM defined.
#include "contender.h"

#include <rmm/aligned.hpp>
#include <rmm/mr/arena_memory_resource.hpp>
#include <rmm/mr/cuda_async_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>

#include <rmm/version_config.hpp>

#include <cuda/memory_resource>
#include <cuda/stream>
#include <cuda/version>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>

namespace cachalot_bench {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

using Upstream = cuda::mr::any_resource<cuda::mr::device_accessible>;

// What every RMM contender shares: the resource handle, allocation and
// deallocation on the caller's stream, and release() as "drop the resource and
// make a new one". Dropping the last handle of an RMM resource gives back all
// it took from the device (the pool its upstream blocks, the arena its global
// arena, the async resource destroys its cudaMemPool), so the next pass starts
// cold, as the other contenders' release() makes theirs.
template <typename Resource>
struct Rmm : Contender {
  std::optional<Resource> mr;

  virtual Resource fresh() = 0;

  void* alloc(size_t size, cudaStream_t stream) override {
    return mr->allocate(cuda::stream_ref{stream}, size, rmm::CUDA_ALLOCATION_ALIGNMENT);
  }
  void free(void* ptr, size_t size, cudaStream_t stream) override {
    mr->deallocate(cuda::stream_ref{stream}, ptr, size, rmm::CUDA_ALLOCATION_ALIGNMENT);
  }
  void release() override {
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    mr.reset();
    mr.emplace(fresh());
  }
};

// The pool starts empty (initial size 0, no maximum), as PyTorch's cache and
// cachalot start, so its first pass pays for its growth as theirs does. With
// no maximum RMM grows it by max(request, current pool size) from the device
// whenever no free block fits, so the pool about doubles as it grows, and it
// never shrinks: its current size is also its peak.
struct Pool : Rmm<rmm::mr::pool_memory_resource> {
  Pool() { mr.emplace(fresh()); }
  rmm::mr::pool_memory_resource fresh() override {
    return rmm::mr::pool_memory_resource{Upstream{rmm::mr::cuda_memory_resource{}}, 0};
  }
  std::pair<uint64_t, uint64_t> reserved() override {
    uint64_t size = mr->pool_size();
    return {size, size};
  }
};

// The arena's size is fixed when it is made: it takes it all from the device
// at once and cannot grow. RMM's default is half the device's free memory,
// which beside six other contenders' caches in one process would starve them;
// so it gets 1.5 times the peak of live requested bytes of what it will
// replay (at least 1 GiB), and never more than RMM's own default at the time
// it is made. CACHALOT_RMM_ARENA_BYTES, when set, gives the size instead.
// Reserved is that size, held from the making on (RMM reports nothing finer).
struct Arena : Rmm<rmm::mr::arena_memory_resource> {
  uint64_t peak_live;
  uint64_t size = 0;
  explicit Arena(uint64_t peak) : peak_live(peak) { mr.emplace(fresh()); }
  rmm::mr::arena_memory_resource fresh() override {
    size = arena_size();
    return rmm::mr::arena_memory_resource{Upstream{rmm::mr::cuda_memory_resource{}}, size};
  }
  uint64_t arena_size() const {
    if (const char* fixed = std::getenv("CACHALOT_RMM_ARENA_BYTES")) return std::strtoull(fixed, nullptr, 10);
    size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    uint64_t wanted = std::max<uint64_t>(peak_live / 2 * 3, uint64_t{1} << 30);
    return std::min<uint64_t>(wanted, free / 2) / rmm::CUDA_ALLOCATION_ALIGNMENT * rmm::CUDA_ALLOCATION_ALIGNMENT;
  }
  std::pair<uint64_t, uint64_t> reserved() override { return {size, size}; }
};

// cudaMallocAsync on a pool of RMM's making, no initial size, the release
// threshold left at RMM's default (the maximum: the pool keeps what it took).
// Reserved is the pool's own count (cudaMemPoolAttrReservedMem*).
struct Async : Rmm<rmm::mr::cuda_async_memory_resource> {
  Async() { mr.emplace(fresh()); }
  rmm::mr::cuda_async_memory_resource fresh() override { return rmm::mr::cuda_async_memory_resource{}; }
  std::pair<uint64_t, uint64_t> reserved() override {
    uint64_t current = 0, high = 0;
    cudaMemPool_t pool = mr->pool_handle();
    check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &current), "reserved current");
    check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &high), "reserved high");
    return {current, high};
  }
};

}  // namespace

std::string rmm_version() {
  return std::string("RMM ") + RMM_VERSION + ", CCCL " + std::to_string(CCCL_MAJOR_VERSION) + "." +
         std::to_string(CCCL_MINOR_VERSION) + "." + std::to_string(CCCL_PATCH_VERSION);
}

std::unique_ptr<Contender> make_rmm(const std::string& name, uint64_t peak_live) {
  if (name == "rmm:pool") return std::make_unique<Pool>();
  if (name == "rmm:arena") return std::make_unique<Arena>(peak_live);
  if (name == "rmm:async") return std::make_unique<Async>();
  throw std::runtime_error("unknown RMM contender " + name + " (rmm:pool, rmm:arena, rmm:async)");
}

}  // namespace cachalot_bench

// The one interface every contender of the native bench implements, shared by
// native_alloc.cpp (PyTorch's allocator, cudaMallocAsync, cachalot's plug-in)
// and rmm_contenders.cu (RMM). It includes no torch header, so that nvcc can
// compile rmm_contenders.cu against RMM's own copy of CCCL without meeting
// PyTorch's headers or the toolkit's CCCL through them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace cachalot_bench {

// One contender: allocate on a stream, free (ordered on the allocating stream).
struct Contender {
  virtual ~Contender() = default;
  virtual void* alloc(size_t size, cudaStream_t stream) = 0;
  // `size` is what alloc was asked for: RMM's resources need it back, the
  // others ignore it (the op lists carry it, so passing it costs the replay
  // loop nothing).
  virtual void free(void* ptr, size_t size, cudaStream_t stream) = 0;
  // Reserved bytes now and at peak, as the allocator counts them; {0, 0} where
  // it counts none.
  virtual std::pair<uint64_t, uint64_t> reserved() = 0;
  // Returns cached memory to the device and resets the peak, so that the next
  // pass starts cold.
  virtual void release() = 0;
  // Called before each of its turns (and before its statistics are read):
  // contenders that share one allocator with another (PyTorch's, with and
  // without expandable segments) take it over here.
  virtual void enter() {}
};

#ifdef CACHALOT_WITH_RMM
// "rmm:pool", "rmm:arena" or "rmm:async" (rmm_contenders.cu); throws for any
// other name. `peak_live` is the most requested bytes live at once in what the
// caller will replay: only rmm:arena, whose size is fixed when it is made,
// uses it.
std::unique_ptr<Contender> make_rmm(const std::string& name, uint64_t peak_live);
// RMM's version and that of the CCCL it was compiled against, e.g. "RMM 26.10.0, CCCL 3.5.0".
std::string rmm_version();
#endif

}  // namespace cachalot_bench

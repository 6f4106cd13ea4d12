// Allocations made while the caching allocator is disabled
// (torch.cuda.caching_allocator_enable(False)): as PyTorch's own allocator
// then does, plain cudaMalloc and cudaFree, outside the cache and its
// statistics. Remembered by address so that a free finds them, whether or not
// caching is on again by then.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <atomic>
#include <mutex>
#include <unordered_set>

namespace cachalot {

class UncachedAllocations {
 public:
  void* malloc(size_t nbytes, c10::DeviceIndex device) {
    c10::cuda::CUDAGuard guard(device);
    void* ptr = nullptr;
    cudaError_t err = cudaMalloc(&ptr, nbytes);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      TORCH_CHECK_WITH(
          OutOfMemoryError, false, "CUDA out of memory. Tried to allocate ", nbytes, " bytes with caching off.");
    }
    C10_CUDA_CHECK(err);
    std::lock_guard<std::mutex> lock(mu_);
    live_.insert(ptr);
    count_.store(live_.size());
    return ptr;
  }

  // Frees `ptr` if it is one of these; false for any other pointer.
  bool free(void* ptr) {
    if (count_.load(std::memory_order_relaxed) == 0) {
      return false;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (live_.erase(ptr) == 0) {
        return false;
      }
      count_.store(live_.size());
    }
    C10_CUDA_CHECK(cudaFree(ptr));
    return true;
  }

 private:
  std::mutex mu_;
  std::unordered_set<void*> live_;
  std::atomic<size_t> count_{0};
};

} // namespace cachalot

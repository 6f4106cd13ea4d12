// The cachalot library's C ABI for the C++ allocator: the functions and rows
// generated from the Rust crate (cachalot_ffi.h), and the route callbacks the
// C++ side owns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include <cuda_runtime_api.h>

#include "cachalot_ffi.h"

extern "C" {
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

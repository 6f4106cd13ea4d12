// Elementwise kernels of cachalot-tensor, compiled at run time with NVRTC.
// Each element type T is loaded into a compute type C, combined, and stored back.
// No headers: half and bfloat16 conversions are written out (PTX cvt for half,
// bit arithmetic with round-to-nearest-even for bfloat16).

typedef unsigned short u16;
typedef unsigned long long u64;

__device__ __forceinline__ float h2f(u16 h) { float f; asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ u16 f2h(float f) { u16 h; asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float bits2f(unsigned u) { float f; asm("{ mov.b32 %0, %1; }" : "=f"(f) : "r"(u)); return f; }
__device__ __forceinline__ unsigned f2bits(float f) { unsigned u; asm("{ mov.b32 %0, %1; }" : "=r"(u) : "f"(f)); return u; }
__device__ __forceinline__ float b2f(u16 b) { return bits2f(((unsigned)b) << 16); }
__device__ __forceinline__ u16 f2b(float f) {
    unsigned u = f2bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

#define ID(x) (x)
#define BOOL_STORE(x) ((unsigned char)((x) != 0))

#define ELEMENTWISE(NAME, T, C, LOAD, STORE)                                                   \
extern "C" __global__ void binary_##NAME(T* out, const T* a, const T* b, u64 n, int op) {     \
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)blockDim.x * gridDim.x) { \
        C x = (C)LOAD(a[i]); C y = (C)LOAD(b[i]);                                              \
        out[i] = STORE(op == 0 ? (C)(x + y) : (C)(x * y));                                     \
    }                                                                                          \
}                                                                                              \
extern "C" __global__ void scalar_##NAME(T* out, const T* a, double s, u64 n, int op) {       \
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)blockDim.x * gridDim.x) { \
        C x = (C)LOAD(a[i]); C y = (C)s;                                                       \
        out[i] = STORE(op == 0 ? (C)(x + y) : (C)(x * y));                                     \
    }                                                                                          \
}                                                                                              \
extern "C" __global__ void fill_##NAME(T* out, double v, u64 n) {                             \
    T value = STORE((C)v);                                                                     \
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)blockDim.x * gridDim.x) { \
        out[i] = value;                                                                        \
    }                                                                                          \
}                                                                                              \
extern "C" __global__ void gather_##NAME(T* out, const T* in, u64 n, int ndim,                \
        u64 s0, u64 s1, u64 s2, u64 s3, u64 t0, u64 t1, u64 t2, u64 t3) {                      \
    u64 size[4] = {s0, s1, s2, s3}; u64 stride[4] = {t0, t1, t2, t3};                          \
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)blockDim.x * gridDim.x) { \
        u64 rest = i, at = 0;                                                                  \
        for (int d = ndim - 1; d >= 0; --d) { at += (rest % size[d]) * stride[d]; rest /= size[d]; } \
        out[i] = in[at];                                                                       \
    }                                                                                          \
}

ELEMENTWISE(f32, float, float, ID, ID)
ELEMENTWISE(f64, double, double, ID, ID)
ELEMENTWISE(f16, u16, float, h2f, f2h)
ELEMENTWISE(bf16, u16, float, b2f, f2b)
ELEMENTWISE(i64, long long, long long, ID, ID)
ELEMENTWISE(i32, int, int, ID, ID)
ELEMENTWISE(u8, unsigned char, int, ID, (unsigned char))
ELEMENTWISE(bool, unsigned char, int, ID, BOOL_STORE)

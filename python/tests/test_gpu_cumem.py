"""A vLLM-style sleep-mode allocator (vLLM's CuMemAllocator: a MemPool whose
segments come from a CUDAPluggableAllocator that maps its own pages with the
driver's virtual memory API) runs unchanged on top of cachalot (issue 49).

The C++ callbacks are compiled here, at test time, against libcuda:
`my_malloc` reserves a range of addresses, creates physical memory, maps it
and grants access (cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess)
and keeps the segment in a registry (address -> handle, size, device, tag);
`my_free` unmaps and releases it. `cumem_sleep(tag)` copies the segments of
that tag to host memory (the weights), discards the others (the KV cache),
then unmaps and releases every segment's pages while keeping its addresses
reserved; `cumem_wake()` creates and maps new pages at the same addresses and
copies the saved bytes back. The program allocates tensors of varied sizes in
two pools of that allocator, multiplies matrices with them, sleeps (the
driver's free memory rises by what the allocator held), wakes (the weights are
intact, the KV cache and new allocations work, the product is the same), sleeps
and wakes again, then frees everything: every segment the allocator gave went
back to it.

Each run is a process of its own, natively (PyTorch's own allocator, which
shows the test itself is right) and under the plug-in with the suite's policy
(CACHALOT_ALLOC_CONF: the GPU script runs the suite once per policy). Skips
without a GPU."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

MIB = 1 << 20

SOURCE = r"""
#include <cuda.h>
#include <sys/types.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

namespace {

struct Segment {
  size_t size = 0;    // what the caller asked for
  size_t mapped = 0;  // rounded up to the allocation granularity
  int device = 0;
  int tag = 0;
  CUmemGenericAllocationHandle handle = 0;
  bool has_pages = false;
  void* host = nullptr;  // the saved bytes while asleep, if the tag was offloaded
};

std::mutex lock;
std::map<CUdeviceptr, Segment> segments;
int current_tag = 0;
long long mallocs = 0, frees = 0, failures = 0, unknown_frees = 0, size_mismatches = 0;
char last_error[512] = "";

bool check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return true;
  const char* text = nullptr;
  cuGetErrorString(r, &text);
  std::snprintf(last_error, sizeof last_error, "%s: %s (%d)", what, text ? text : "?", static_cast<int>(r));
  return false;
}

// Makes the device's primary context current for the scope (PyTorch uses it).
struct OnDevice {
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  bool pushed = false;
  explicit OnDevice(int device) {
    if (!check(cuInit(0), "cuInit") || !check(cuDeviceGet(&dev, device), "cuDeviceGet")) return;
    if (!check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain")) { ctx = nullptr; return; }
    pushed = check(cuCtxPushCurrent(ctx), "cuCtxPushCurrent");
  }
  ~OnDevice() {
    if (pushed) { CUcontext popped; cuCtxPopCurrent(&popped); }
    if (ctx) cuDevicePrimaryCtxRelease(dev);
  }
  bool ok() const { return pushed; }
};

CUmemAllocationProp props(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

bool map_pages(Segment& s, CUdeviceptr at) {
  CUmemAllocationProp prop = props(s.device);
  if (!check(cuMemCreate(&s.handle, s.mapped, &prop, 0), "cuMemCreate")) return false;
  if (!check(cuMemMap(at, s.mapped, 0, s.handle, 0), "cuMemMap")) {
    cuMemRelease(s.handle);
    return false;
  }
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (!check(cuMemSetAccess(at, s.mapped, &access, 1), "cuMemSetAccess")) {
    cuMemUnmap(at, s.mapped);
    cuMemRelease(s.handle);
    return false;
  }
  s.has_pages = true;
  return true;
}

bool unmap_pages(Segment& s, CUdeviceptr at) {
  if (!check(cuMemUnmap(at, s.mapped), "cuMemUnmap")) return false;
  if (!check(cuMemRelease(s.handle), "cuMemRelease")) return false;
  s.has_pages = false;
  return true;
}

}  // namespace

extern "C" {

void* my_malloc(ssize_t size, int device, CUstream stream) {
  std::lock_guard<std::mutex> guard(lock);
  OnDevice on(device);
  if (!on.ok()) { failures++; return nullptr; }
  Segment s;
  s.size = static_cast<size_t>(size);
  s.device = device;
  s.tag = current_tag;
  CUmemAllocationProp prop = props(device);
  size_t granularity = 0;
  if (!check(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
             "cuMemGetAllocationGranularity")) { failures++; return nullptr; }
  s.mapped = (s.size + granularity - 1) / granularity * granularity;
  CUdeviceptr at = 0;
  if (!check(cuMemAddressReserve(&at, s.mapped, 0, 0, 0), "cuMemAddressReserve")) { failures++; return nullptr; }
  if (!map_pages(s, at)) {
    cuMemAddressFree(at, s.mapped);
    failures++;
    return nullptr;
  }
  segments[at] = s;
  mallocs++;
  return reinterpret_cast<void*>(at);
}

void my_free(void* ptr, ssize_t size, int device, CUstream stream) {
  std::lock_guard<std::mutex> guard(lock);
  auto it = segments.find(reinterpret_cast<CUdeviceptr>(ptr));
  if (it == segments.end()) { unknown_frees++; return; }
  Segment& s = it->second;
  OnDevice on(s.device);
  cuCtxSynchronize();  // no kernel may still use the pages
  if (static_cast<size_t>(size) != s.size) size_mismatches++;
  if (s.has_pages && !unmap_pages(s, it->first)) failures++;
  if (!check(cuMemAddressFree(it->first, s.mapped), "cuMemAddressFree")) failures++;
  std::free(s.host);
  segments.erase(it);
  frees++;
}

// Segments allocated from now on carry this tag.
void cumem_set_tag(int tag) {
  std::lock_guard<std::mutex> guard(lock);
  current_tag = tag;
}

// Saves the segments of `offload_tag` to host memory, discards the others,
// and gives every segment's pages back, keeping the addresses reserved. The
// bytes whose pages went back, or -1 (cumem_last_error says why).
long long cumem_sleep(int offload_tag) {
  std::lock_guard<std::mutex> guard(lock);
  long long released = 0;
  for (auto& [at, s] : segments) {
    if (!s.has_pages) continue;
    OnDevice on(s.device);
    if (!on.ok() || !check(cuCtxSynchronize(), "cuCtxSynchronize")) return -1;
    if (s.tag == offload_tag) {
      s.host = std::malloc(s.size);
      if (!s.host) { std::snprintf(last_error, sizeof last_error, "no host memory"); return -1; }
      if (!check(cuMemcpyDtoH(s.host, at, s.size), "cuMemcpyDtoH")) return -1;
    }
    if (!unmap_pages(s, at)) return -1;
    released += static_cast<long long>(s.mapped);
  }
  return released;
}

// New pages at the same addresses, the saved bytes copied back. The bytes
// mapped again, or -1.
long long cumem_wake() {
  std::lock_guard<std::mutex> guard(lock);
  long long mapped = 0;
  for (auto& [at, s] : segments) {
    if (s.has_pages) continue;
    OnDevice on(s.device);
    if (!on.ok() || !map_pages(s, at)) return -1;
    if (s.host) {
      if (!check(cuMemcpyHtoD(at, s.host, s.size), "cuMemcpyHtoD")) return -1;
      std::free(s.host);
      s.host = nullptr;
    }
    mapped += static_cast<long long>(s.mapped);
  }
  return mapped;
}

// mallocs, frees, live segments, bytes with pages, bytes reserved, failures,
// frees of unknown addresses, frees whose size differs from the malloc's.
void cumem_stats(long long* out) {
  std::lock_guard<std::mutex> guard(lock);
  long long with_pages = 0, reserved = 0;
  for (auto& [at, s] : segments) {
    reserved += static_cast<long long>(s.mapped);
    if (s.has_pages) with_pages += static_cast<long long>(s.mapped);
  }
  long long values[8] = {mallocs, frees, static_cast<long long>(segments.size()), with_pages, reserved,
                         failures, unknown_frees, size_mismatches};
  for (int i = 0; i < 8; i++) out[i] = values[i];
}

const char* cumem_last_error() { return last_error; }

}  // extern "C"
"""

PROGRAM = r"""
import contextlib, ctypes, gc, json, sys
import torch

who, lib_path = sys.argv[1], sys.argv[2]
if who == "cachalot":
    import cachalot_torch
    cachalot_torch.use()  # the policy from CACHALOT_ALLOC_CONF
MIB = 1 << 20
WEIGHTS, KV_CACHE = 1, 2
STATS = ("mallocs", "frees", "live", "with_pages", "reserved", "failures", "unknown_frees", "size_mismatches")

lib = ctypes.CDLL(lib_path)
lib.cumem_set_tag.argtypes = [ctypes.c_int]
lib.cumem_sleep.argtypes = [ctypes.c_int]
lib.cumem_sleep.restype = ctypes.c_longlong
lib.cumem_wake.restype = ctypes.c_longlong
lib.cumem_last_error.restype = ctypes.c_char_p


def stats():
    out = (ctypes.c_longlong * len(STATS))()
    lib.cumem_stats(out)
    return dict(zip(STATS, out))


class SleepAllocator:
    # vLLM's shape: a pluggable allocator, a MemPool per use_memory_pool(tag).
    def __init__(self):
        self.allocator = torch.cuda.memory.CUDAPluggableAllocator(lib_path, "my_malloc", "my_free")
        self.pools = []

    @contextlib.contextmanager
    def use_memory_pool(self, tag):
        lib.cumem_set_tag(tag)
        pool = torch.cuda.MemPool(self.allocator._allocator)
        self.pools.append(pool)
        try:
            with torch.cuda.use_mem_pool(pool):
                yield pool
        finally:
            lib.cumem_set_tag(0)

    def sleep(self, offload_tag):
        torch.cuda.synchronize()
        released = lib.cumem_sleep(offload_tag)
        assert released >= 0, lib.cumem_last_error().decode()
        return released

    def wake_up(self):
        mapped = lib.cumem_wake()
        assert mapped >= 0, lib.cumem_last_error().decode()
        torch.cuda.synchronize()
        return mapped


def free_memory():
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


out = {}
torch.manual_seed(0)
# cuBLAS's workspace is allocated at the first product: outside the pools, or
# it would keep a pool's segment alive to the end.
warm = torch.randn(256, 256, device="cuda")
torch.matmul(warm, warm, out=torch.empty_like(warm))
(warm @ warm + warm[0]).sum().item()
del warm

cumem = SleepAllocator()
T = {}
with cumem.use_memory_pool(WEIGHTS):
    T["w_small"] = torch.randn(300, 250, device="cuda")       # 293 KiB
    T["bias"] = torch.randn(1536, device="cuda")              # 6 KiB
    T["w1"] = torch.randn(2048, 4096, device="cuda") / 64     # 32 MiB
    T["w2"] = torch.randn(4096, 1536, device="cuda") / 64     # 24 MiB
    T["x"] = torch.randn(512, 2048, device="cuda")            # 4 MiB
    T["odd"] = torch.randint(0, 256, (3 * MIB + 12345,), dtype=torch.uint8, device="cuda")
weight_names = list(T)
with cumem.use_memory_pool(KV_CACHE):
    T["kv"] = torch.empty(16 * MIB, device="cuda")            # 64 MiB
    T["kv_small"] = torch.empty(25_000, device="cuda")        # 98 KiB
    T["h"] = T["kv"][: 512 * 4096].view(512, 4096)
    torch.matmul(T["x"], T["w1"], out=T["h"])
    T["y"] = T["h"] @ T["w2"] + T["bias"]
    T["kv_small"].copy_(T["w_small"].flatten()[:25_000] * 2)
torch.cuda.synchronize()
saved = {k: T[k].cpu() for k in weight_names}
y_before = T["y"].cpu()
addresses = {k: t.data_ptr() for k, t in T.items()}
out["torch_pool_bytes"] = sum(s["total_size"] for p in cumem.pools for s in p.snapshot())
out["awake"] = stats()

# Sleep: the weights to the host, the KV cache discarded, the pages released.
free_awake = free_memory()
out["released"] = cumem.sleep(WEIGHTS)
free_asleep = free_memory()
out["free_rise"] = free_asleep - free_awake
out["asleep"] = stats()
# PyTorch's own memory still serves while the pools sleep.
outside = torch.full((8 * MIB,), 1, dtype=torch.uint8, device="cuda")
out["outside_sum"] = int(outside.sum().item())
del outside
free_before_wake = free_memory()
out["woken"] = cumem.wake_up()
out["free_drop"] = free_before_wake - free_memory()

out["same_addresses"] = all(T[k].data_ptr() == a for k, a in addresses.items())
out["weights_intact"] = {k: bool(torch.equal(T[k].cpu(), saved[k])) for k in weight_names}
T["kv"].view(torch.int32).fill_(3)
out["kv_sum"] = int(T["kv"].view(torch.int32).sum().item())
torch.matmul(T["x"], T["w1"], out=T["h"])
y_after = (T["h"] @ T["w2"] + T["bias"]).cpu()
out["product_max_diff"] = float((y_after - y_before).abs().max().item())

# New allocations: in a pool (a new segment) and outside.
mallocs_before = stats()["mallocs"]
with cumem.use_memory_pool(WEIGHTS):
    T["late"] = torch.arange(10 * MIB, dtype=torch.int32, device="cuda")   # 40 MiB
    T["late_small"] = torch.full((1000,), 7, dtype=torch.int32, device="cuda")
out["new_segments"] = stats()["mallocs"] - mallocs_before
fresh = torch.ones(MIB, device="cuda")
out["fresh_sum"] = float(fresh.sum().item())
del fresh

# Again: sleep and wake with the new allocations.
late_sum = int(T["late"].sum(dtype=torch.int64).item())
with_pages = stats()["with_pages"]
free_awake = free_memory()
out["released_2"] = cumem.sleep(WEIGHTS)
out["free_rise_2"] = free_memory() - free_awake
out["with_pages_2"] = with_pages
cumem.wake_up()
out["late_intact"] = int(T["late"].sum(dtype=torch.int64).item()) == late_sum and int(T["late_small"].sum().item()) == 7000
out["weights_intact_2"] = all(torch.equal(T[k].cpu(), saved[k]) for k in weight_names)

if who == "cachalot":
    cachalot_torch.validate()
# Everything freed: the pools empty, every segment back to my_free.
T.clear()
del y_after
gc.collect()
torch.cuda.synchronize()
cumem.pools.clear()
gc.collect()
torch.cuda.empty_cache()
out["end"] = stats()
if who == "cachalot":
    cachalot_torch.validate()
    out["policy"] = cachalot_torch.config()["policy"]
print("RESULT " + json.dumps(out), flush=True)
"""


def _stub_dirs(cuda_home):
    """The toolkit's stub libcuda (soname libcuda.so.1, the driver's at run
    time), for machines whose driver brings no unversioned libcuda.so."""
    if not cuda_home:
        return []
    home = pathlib.Path(cuda_home)
    candidates = [home / "lib64" / "stubs", home / "lib" / "stubs", home / "targets" / "x86_64-linux" / "lib" / "stubs"]
    return [f"-L{d}" for d in candidates if (d / "libcuda.so").exists()]


@pytest.fixture(scope="module")
def cumem_library(request, tmp_path_factory):
    if not request.config.cachalot_gpu:
        pytest.skip("skipped: no GPU (or no torch): the vLLM-style allocator needs a CUDA device")
    from torch.utils import cpp_extension

    build = tmp_path_factory.mktemp("cumem")
    source = build / "cachalot_cumem_test.cpp"
    source.write_text(SOURCE)
    flags = _stub_dirs(cpp_extension.CUDA_HOME) + ["-lcuda"]
    # Built in a process of its own: cpp_extension.load also loads the library,
    # and this process (the suite's, the plug-in installed) must not carry it.
    done = subprocess.run([sys.executable, "-c", BUILD, str(source), str(build), json.dumps(flags)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"building the allocator failed: {done.stderr[-3000:]}"
    return str(build / "cachalot_cumem_test.so")


BUILD = """
import json, sys
from torch.utils import cpp_extension
cpp_extension.load(name="cachalot_cumem_test", sources=[sys.argv[1]], extra_ldflags=json.loads(sys.argv[3]),
                   with_cuda=True, is_python_module=False, build_directory=sys.argv[2])
"""


@pytest.mark.parametrize("who", ["native", "cachalot"])
def test_a_vllm_style_cumem_allocator_sleeps_and_wakes(torch_gpu, cumem_library, who):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if who == "native":
        env.pop("CACHALOT_ALLOC_CONF", None)
    done = subprocess.run([sys.executable, "-c", PROGRAM, who, cumem_library],
                          capture_output=True, text=True, env=env, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"{who}: exit {done.returncode}: {done.stderr[-3000:]}"
    r = json.loads(lines[-1][len("RESULT "):])
    print(who, json.dumps(r, indent=1))
    awake, asleep, end = r["awake"], r["asleep"], r["end"]
    held = awake["with_pages"]
    assert awake["failures"] == 0 and awake["mallocs"] >= 2, awake
    assert held >= 128 * MIB, f"the pools hold the tensors' bytes: {awake}"
    assert r["released"] == held and asleep["with_pages"] == 0 and asleep["reserved"] == held, (r["released"], asleep)
    assert held * 0.9 <= r["free_rise"] <= held * 1.1 + 16 * MIB, (
        f"sleeping gives the pages back to the driver: free memory rose by {r['free_rise']}, the pools held {held}")
    assert r["outside_sum"] == 8 * MIB, "PyTorch's own memory serves while the pools sleep"
    assert r["woken"] == held
    assert r["free_drop"] >= held * 0.9, f"waking takes the pages again: {r['free_drop']} of {held}"
    assert r["same_addresses"]
    assert all(r["weights_intact"].values()), f"the offloaded weights came back: {r['weights_intact']}"
    assert r["kv_sum"] == 3 * 16 * MIB
    assert r["product_max_diff"] <= 1e-4, "the same product after the wake"
    assert r["new_segments"] >= 1, "a new allocation in a pool takes a new segment of the allocator"
    assert r["fresh_sum"] == MIB
    assert r["released_2"] == r["with_pages_2"] and r["free_rise_2"] >= r["with_pages_2"] * 0.9, r
    assert r["late_intact"] and r["weights_intact_2"], "the second sleep kept the weights and the late tensors"
    assert end["frees"] == end["mallocs"] and end["live"] == 0, (
        f"every segment went back to my_free once the tensors and pools were gone: {end}")
    assert end["unknown_frees"] == 0 and end["size_mismatches"] == 0 and end["failures"] == 0, end

// What the driver's virtual-memory calls cost on this machine, per physical
// handle, and whether threads make them cheaper: the facts the cachalot
// policy's mapping choices rest on (docs/benchmarks.md).
//
// For each handle size, N handles are created, then mapped and opened
// (cuMemMap + cuMemSetAccess, one pair per handle) into one reserved range,
// unmapped, and released; the map and unmap phases are repeated with 1, 2, 4
// and 8 threads, each thread taking every T-th handle, and each phase is
// timed by the wall clock around all of its threads. A first untimed round
// warms the driver up. Prints a markdown table and writes it to the file
// named by the first argument.
//
// Build and run (on the GPU machine): nvcc -O2 -o driver_costs driver_costs.cu -lcuda
//   ./driver_costs OUT.md [N]
#include <cuda.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* name = "?";
  cuGetErrorString(r, &name);
  std::fprintf(stderr, "driver_costs: %s failed: %s\n", what, name);
  std::exit(1);
}

double micros() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

struct Device {
  CUcontext ctx{};
  CUmemAllocationProp prop{};
  CUmemAccessDesc access{};
  size_t granularity = 0;
};

Device open_device() {
  Device d;
  check(cuInit(0), "cuInit");
  CUdevice dev;
  check(cuDeviceGet(&dev, 0), "cuDeviceGet");
  check(cuDevicePrimaryCtxRetain(&d.ctx, dev), "cuDevicePrimaryCtxRetain");
  check(cuCtxSetCurrent(d.ctx), "cuCtxSetCurrent");
  d.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  d.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.prop.location.id = 0;
  d.access.location = d.prop.location;
  d.access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  check(cuMemGetAllocationGranularity(&d.granularity, &d.prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "cuMemGetAllocationGranularity");
  return d;
}

// Runs `each(i)` for every handle index, spread over `threads` threads;
// returns the wall-clock microseconds per handle.
template <class F>
double spread(const Device& d, int n, int threads, F each) {
  const double start = micros();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      check(cuCtxSetCurrent(d.ctx), "cuCtxSetCurrent");
      for (int i = t; i < n; i += threads) each(i);
    });
  }
  for (auto& th : pool) th.join();
  return (micros() - start) / n;
}

struct Row {
  size_t mib;
  int threads;
  double create, map, unmap, release;
};

// One handle size: create, map + open, unmap and release N handles with
// `threads` threads; the first round (threads == 0) is a warm-up.
Row measure(const Device& d, size_t bytes, int n, int threads) {
  const int t = threads > 0 ? threads : 1;
  std::vector<CUmemGenericAllocationHandle> h(n);
  CUdeviceptr base;
  check(cuMemAddressReserve(&base, bytes * n, 0, 0, 0), "cuMemAddressReserve");
  Row r{bytes >> 20, threads, 0, 0, 0, 0};
  r.create = spread(d, n, t, [&](int i) { check(cuMemCreate(&h[i], bytes, &d.prop, 0), "cuMemCreate"); });
  r.map = spread(d, n, t, [&](int i) {
    const CUdeviceptr at = base + bytes * i;
    check(cuMemMap(at, bytes, 0, h[i], 0), "cuMemMap");
    check(cuMemSetAccess(at, bytes, &d.access, 1), "cuMemSetAccess");
  });
  r.unmap = spread(d, n, t, [&](int i) { check(cuMemUnmap(base + bytes * i, bytes), "cuMemUnmap"); });
  r.release = spread(d, n, t, [&](int i) { check(cuMemRelease(h[i]), "cuMemRelease"); });
  check(cuMemAddressFree(base, bytes * n), "cuMemAddressFree");
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: driver_costs OUT.md [N]\n");
    return 2;
  }
  const int n = argc > 2 ? std::atoi(argv[2]) : 256;
  if (n < 1) {
    std::fprintf(stderr, "driver_costs: N must be at least 1\n");
    return 2;
  }
  const Device d = open_device();
  std::vector<Row> rows;
  for (size_t pages : {size_t{1}, size_t{10}, size_t{32}}) {
    const size_t bytes = pages * d.granularity;
    measure(d, bytes, n, 0);
    for (int threads : {1, 2, 4, 8}) rows.push_back(measure(d, bytes, n, threads));
  }
  std::string md =
      "| handle MiB | threads | cuMemCreate us | cuMemMap + cuMemSetAccess us | cuMemUnmap us | "
      "cuMemRelease us | map + open vs 1 thread |\n|---:|---:|---:|---:|---:|---:|---:|\n";
  double one = 0;
  for (const Row& r : rows) {
    if (r.threads == 1) one = r.map;
    char line[256];
    std::snprintf(line, sizeof line, "| %zu | %d | %.1f | %.1f | %.1f | %.1f | %.2fx |\n", r.mib,
                  r.threads, r.create, r.map, r.unmap, r.release, one / r.map);
    md += line;
  }
  std::printf("Driver calls, wall-clock microseconds per handle (%d handles a row):\n\n%s", n,
              md.c_str());
  FILE* f = std::fopen(argv[1], "w");
  if (f == nullptr) {
    std::fprintf(stderr, "driver_costs: cannot write %s\n", argv[1]);
    return 1;
  }
  std::fprintf(f, "Driver calls, wall-clock microseconds per handle (%d handles a row):\n\n%s", n,
               md.c_str());
  std::fclose(f);
  return 0;
}

// The native contenders of cachalot's GPU benchmark, as a PyTorch C++ extension:
// PyTorch's caching allocator (raw_alloc_with_stream / raw_delete), as
// configured by default ("pytorch") and with expandable segments
// ("pytorch:expandable"), and cudaMallocAsync on the device's default pool with the release threshold at its
// maximum (a kept pool). Both replay the same op lists as cachalot's Rust bench
// (scripts/trace-to-ops.py writes them) and run the same threaded pattern, timed
// inside C++ with steady_clock over the whole sequence.
//
// cachalot takes part through its PyTorch plug-in (libcachalot_torch.so) called
// through its C entry points, as PyTorch calls it: contender "cachalot:<policy>"
// loads a private copy of the library configured with policy:<policy>, so both
// policies live in this process beside PyTorch's allocator. `turns` replays an
// op list through several contenders in turn, so a slow spell of the host
// touches each alike.
//
// With CACHALOT_WITH_RMM (native_bench.py defines it where the RMM wheels are
// present), RMM's pool, arena and async resources take part too, as
// "rmm:pool", "rmm:arena" and "rmm:async" (rmm_contenders.cu, built by nvcc
// into the same extension; contender.h is the interface both files share).
#include "contender.h"

#include <torch/extension.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using cachalot_bench::Contender;

// One op of an op list. A free carries the size of the allocation it frees
// (load_ops fills it in), for the contenders that need it back.
struct Op {
  bool alloc;
  uint32_t id;
  uint64_t size;
  uint32_t stream;
};

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Parses one unsigned number at `p`, moving `p` past it and its trailing blanks.
bool take_number(const char*& p, uint64_t& out) {
  char* end = nullptr;
  out = std::strtoull(p, &end, 10);
  if (end == p) return false;
  p = end;
  while (*p == ' ') ++p;
  return true;
}

std::vector<Op> load_ops(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::vector<Op> ops;
  std::vector<uint64_t> size_of;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const char* p = line.c_str() + 1;
    while (*p == ' ') ++p;
    uint64_t id = 0, size = 0, stream = 0;
    bool alloc = line[0] == 'a';
    bool ok = (line[0] == 'a' || line[0] == 'f') && take_number(p, id);
    if (alloc) ok = ok && take_number(p, size) && take_number(p, stream) && size > 0;
    if (!ok) throw std::runtime_error("bad op line in " + path + ": " + line);
    if (alloc) {
      if (id >= size_of.size()) size_of.resize(id + 1, 0);
      size_of[id] = size;
    } else {
      if (id >= size_of.size() || size_of[id] == 0)
        throw std::runtime_error("free of an unknown id in " + path + ": " + line);
      size = size_of[id];
    }
    ops.push_back(Op{alloc, static_cast<uint32_t>(id), size, static_cast<uint32_t>(stream)});
  }
  return ops;
}

// The most requested bytes live at once over an op list.
uint64_t peak_live(const std::vector<Op>& ops) {
  uint64_t live = 0, peak = 0;
  for (const Op& op : ops) {
    if (op.alloc) {
      live += op.size;
      peak = std::max(peak, live);
    } else {
      live -= op.size;
    }
  }
  return peak;
}

// PyTorch's caching allocator is one per process, so "pytorch" and
// "pytorch:expandable" share it: each sets expandable_segments its own way
// when its turn begins, after emptying the cache the other left (segments of
// the other kind would otherwise serve its requests). Empty until one of
// them first sets it.
std::optional<bool> native_expandable;

void set_expandable(bool on) {
  py::gil_scoped_acquire gil;
  const char* setting = on ? "expandable_segments:True" : "expandable_segments:False";
  // torch 2.9 on; torch.cuda.memory's older name warns that it is deprecated.
  auto c = py::module_::import("torch._C");
  if (py::hasattr(c, "_accelerator_setAllocatorSettings")) {
    c.attr("_accelerator_setAllocatorSettings")(setting);
    return;
  }
  auto memory = py::module_::import("torch.cuda.memory");
  if (!py::hasattr(memory, "_set_allocator_settings"))
    throw std::runtime_error("this torch cannot change its allocator's settings at run time: "
                             "the pytorch:expandable contender cannot take part");
  memory.attr("_set_allocator_settings")(setting);
}

struct Native : Contender {
  bool expandable;
  explicit Native(bool expandable) : expandable(expandable) { enter(); }
  void enter() override {
    if (native_expandable == expandable) return;
    release();
    set_expandable(expandable);
    native_expandable = expandable;
  }
  void* alloc(size_t size, cudaStream_t stream) override {
    return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(size, stream);
  }
  void free(void* ptr, size_t, cudaStream_t) override { c10::cuda::CUDACachingAllocator::raw_delete(ptr); }
  std::pair<uint64_t, uint64_t> reserved() override {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
    auto& r = stats.reserved_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
    return {static_cast<uint64_t>(r.current), static_cast<uint64_t>(r.peak)};
  }
  void release() override {
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    c10::cuda::CUDACachingAllocator::emptyCache();
    c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  }
};

struct Async : Contender {
  cudaMemPool_t pool{};
  Async() {
    check(cudaDeviceGetDefaultMemPool(&pool, 0), "cudaDeviceGetDefaultMemPool");
    uint64_t keep = UINT64_MAX;
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "release threshold");
  }
  void* alloc(size_t size, cudaStream_t stream) override {
    void* p = nullptr;
    check(cudaMallocAsync(&p, size, stream), "cudaMallocAsync");
    return p;
  }
  void free(void* ptr, size_t, cudaStream_t stream) override { check(cudaFreeAsync(ptr, stream), "cudaFreeAsync"); }
  std::pair<uint64_t, uint64_t> reserved() override {
    uint64_t cur = 0, high = 0;
    check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &cur), "reserved current");
    check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &high), "reserved high");
    return {cur, high};
  }
  void release() override {
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    check(cudaMemPoolTrimTo(pool, 0), "cudaMemPoolTrimTo");
    uint64_t zero = 0;
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero), "reset high");
  }
};

// A private copy of cachalot's plug-in, configured with `conf`: the library
// reads CACHALOT_ALLOC_CONF once, at its cachalot_init, and dlopen would hand
// back the same instance for the same file, so each configuration loads its
// own copy. Its reserved bytes are measured by cachalot's own bench, so
// `reserved` reports none.
struct Plugin : Contender {
  using Alloc = void* (*)(ptrdiff_t, int, void*);
  using Free = void (*)(void*, ptrdiff_t, int, void*);
  using Flush = void (*)();
  using Init = int (*)();
  using LastError = char* (*)();
  using StringFree = void (*)(char*);
  Alloc alloc_fn{};
  Free free_fn{};
  Flush empty_fn{};
  LastError error_fn{};
  StringFree string_free_fn{};
  Plugin(const std::string& path, const std::string& conf) {
    static int copies = 0;
    auto copy = std::filesystem::temp_directory_path() /
                ("cachalot-plugin-" + std::to_string(getpid()) + "-" + std::to_string(copies++) + ".so");
    std::filesystem::copy_file(path, copy, std::filesystem::copy_options::overwrite_existing);
    setenv("CACHALOT_ALLOC_CONF", conf.c_str(), 1);
    void* lib = dlopen(copy.c_str(), RTLD_NOW | RTLD_LOCAL);
    std::filesystem::remove(copy);
    if (!lib) throw std::runtime_error("cannot load " + path + ": " + dlerror());
    alloc_fn = reinterpret_cast<Alloc>(dlsym(lib, "cachalot_alloc"));
    free_fn = reinterpret_cast<Free>(dlsym(lib, "cachalot_free"));
    empty_fn = reinterpret_cast<Flush>(dlsym(lib, "cachalot_empty_cache"));
    error_fn = reinterpret_cast<LastError>(dlsym(lib, "cachalot_last_error"));
    string_free_fn = reinterpret_cast<StringFree>(dlsym(lib, "cachalot_string_free"));
    auto init = reinterpret_cast<Init>(dlsym(lib, "cachalot_init"));
    if (!alloc_fn || !free_fn || !empty_fn || !error_fn || !string_free_fn || !init)
      throw std::runtime_error(path + " lacks cachalot's C entry points");
    if (init() != 0) fail("cachalot_init (" + conf + ")");
  }
  [[noreturn]] void fail(const std::string& what) {
    char* why = error_fn();
    std::string message = what + ": " + (why ? why : "failed");
    if (why) string_free_fn(why);
    throw std::runtime_error(message);
  }
  void* alloc(size_t size, cudaStream_t stream) override {
    void* p = alloc_fn(static_cast<ptrdiff_t>(size), 0, stream);
    if (!p) fail("cachalot_alloc");
    return p;
  }
  void free(void* ptr, size_t, cudaStream_t stream) override { free_fn(ptr, 0, 0, stream); }
  std::pair<uint64_t, uint64_t> reserved() override { return {0, 0}; }
  void release() override {
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    empty_fn();
  }
};

// The plug-in library for the "cachalot:<policy>" contenders (set_plugin sets it).
std::string plugin_path;

// Whether the RMM contenders were built in (has_rmm tells Python).
#ifdef CACHALOT_WITH_RMM
constexpr bool kWithRmm = true;
#else
constexpr bool kWithRmm = false;
#endif

// `peak_live`: the most requested bytes the caller will hold at once (only
// rmm:arena, sized when it is made, uses it).
std::unique_ptr<Contender> make(const std::string& name, uint64_t peak_live) {
  if (name == "pytorch") return std::make_unique<Native>(false);
  if (name == "pytorch:expandable") return std::make_unique<Native>(true);
  if (name == "async") return std::make_unique<Async>();
  const std::string prefix = "cachalot:";
  if (name.rfind(prefix, 0) == 0 && !plugin_path.empty())
    return std::make_unique<Plugin>(plugin_path, "policy:" + name.substr(prefix.size()));
  if (name.rfind("rmm:", 0) == 0) {
#ifdef CACHALOT_WITH_RMM
    return cachalot_bench::make_rmm(name, peak_live);
#else
    (void)peak_live;
    throw std::runtime_error("contender " + name + ": this extension was built without RMM "
                             "(native_bench.py found no RMM wheels)");
#endif
  }
  throw std::runtime_error("unknown contender " + name +
                           " (pytorch, pytorch:expandable, async, cachalot:<policy> after set_plugin, rmm:pool, rmm:arena, rmm:async)");
}

uint64_t device_free() {
  size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}

// One pass over an op list, then a device synchronization; returns ns per op
// (the timed region is the loop).
double replay_pass(Contender& contender, const std::vector<Op>& ops, const std::vector<cudaStream_t>& streams,
                   std::vector<void*>& ptrs, std::vector<uint32_t>& stream_of) {
  auto start = std::chrono::steady_clock::now();
  for (const Op& op : ops) {
    if (op.alloc) {
      ptrs[op.id] = contender.alloc(op.size, streams[op.stream]);
      stream_of[op.id] = op.stream;
    } else {
      contender.free(ptrs[op.id], op.size, streams[stream_of[op.id]]);
    }
  }
  auto stop = std::chrono::steady_clock::now();
  // The pass's queued work finishes before the next pass (not timed).
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return std::chrono::duration<double, std::nano>(stop - start).count() / ops.size();
}

// The op list's id count and stream count.
std::pair<uint32_t, uint32_t> shape(const std::vector<Op>& ops) {
  uint32_t ids = 0, nstreams = 1;
  for (auto& op : ops) {
    ids = std::max(ids, op.id + 1);
    if (op.alloc) nstreams = std::max(nstreams, op.stream + 1);
  }
  return {ids, nstreams};
}

// `n` streams on device 0: index 0 the default stream, the others created
// non-blocking (destroy_streams gives them back).
std::vector<cudaStream_t> make_streams(uint32_t n) {
  check(cudaSetDevice(0), "cudaSetDevice");
  std::vector<cudaStream_t> streams(n, nullptr);
  for (uint32_t s = 1; s < n; ++s) check(cudaStreamCreateWithFlags(&streams[s], cudaStreamNonBlocking), "stream");
  return streams;
}

void destroy_streams(const std::vector<cudaStream_t>& streams) {
  for (size_t s = 1; s < streams.size(); ++s) check(cudaStreamDestroy(streams[s]), "stream destroy");
}

// Replays an op list `passes` times; returns ns per op of each pass, the
// allocator's reserved bytes (current after the first pass, peak overall) and the
// device's free bytes before the first pass and after it.
py::dict replay(const std::string& path, const std::string& name, int passes) {
  auto ops = load_ops(path);
  auto [ids, nstreams] = shape(ops);
  uint64_t requested = 0;
  for (auto& op : ops)
    if (op.alloc) requested += op.size;
  auto streams = make_streams(nstreams);
  auto contender = make(name, peak_live(ops));
  contender->release();
  std::vector<void*> ptrs(ids, nullptr);
  std::vector<uint32_t> stream_of(ids, 0);
  py::list ns;
  uint64_t free_before = device_free(), free_after_first = 0, reserved_first = 0;
  for (int pass = 0; pass < passes; ++pass) {
    ns.append(replay_pass(*contender, ops, streams, ptrs, stream_of));
    if (pass == 0) {
      free_after_first = device_free();
      reserved_first = contender->reserved().first;
    }
  }
  auto reserved = contender->reserved();
  contender->release();
  destroy_streams(streams);
  py::dict out;
  out["ops"] = ops.size();
  out["requested_bytes_per_pass"] = requested;
  out["ns_per_op"] = ns;
  out["reserved_after_first"] = reserved_first;
  out["reserved_peak"] = reserved.second;
  out["device_used_after_first"] = free_before - free_after_first;
  return out;
}

// The threaded pattern, identical in cachalot's Rust bench: each thread on its own
// stream keeps 32 slots; each step picks a slot by an LCG, frees what is there and
// allocates a size drawn from a fixed mix of small and large sizes.
constexpr uint64_t kSizes[] = {512, 4096, 32768, 262144, 1048576, 2097152, 6291456, 20971520};
constexpr uint32_t kSlots = 32;

struct Lcg {
  uint64_t x;
  uint64_t next() {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x >> 33;
  }
};

// A slot's allocation and its size (the size goes back to free).
struct Slot {
  void* ptr = nullptr;
  size_t size = 0;
};

uint64_t run_pattern(Contender& c, cudaStream_t stream, uint64_t seed, uint64_t steps, std::vector<Slot>& live) {
  Lcg lcg{seed};
  uint64_t ops = 0;
  for (uint64_t i = 0; i < steps; ++i) {
    uint64_t r = lcg.next();
    Slot& slot = live[r % kSlots];
    if (slot.ptr) {
      c.free(slot.ptr, slot.size, stream);
      ++ops;
    }
    slot.size = kSizes[(r >> 8) % (sizeof(kSizes) / sizeof(kSizes[0]))];
    slot.ptr = c.alloc(slot.size, stream);
    ++ops;
  }
  return ops;
}

// Runs the pattern on `threads` threads, each with its own stream, after an
// untimed warm-up as long as the timed run; returns total operations per
// microsecond.
double scaling(const std::string& name, int threads, uint64_t steps) {
  // At most every slot of every thread holds the largest size.
  auto contender = make(name, uint64_t{kSlots} * threads * kSizes[sizeof(kSizes) / sizeof(kSizes[0]) - 1]);
  contender->release();
  // The streams outlive the cache's last release: PyTorch's expandable
  // segments synchronize their stream when they give pages back.
  std::vector<cudaStream_t> streams(threads);
  for (auto& s : streams) check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<uint64_t> ops(threads, 0);
  std::vector<std::chrono::steady_clock::time_point> ends(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      check(cudaSetDevice(0), "cudaSetDevice");
      cudaStream_t stream = streams[t];
      std::vector<Slot> live(kSlots);
      run_pattern(*contender, stream, t + 1, steps, live);
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      ops[t] = run_pattern(*contender, stream, t + 101, steps, live);
      ends[t] = std::chrono::steady_clock::now();
      for (const Slot& s : live)
        if (s.ptr) contender->free(s.ptr, s.size, stream);
      check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  auto start = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : pool) th.join();
  auto stop = *std::max_element(ends.begin(), ends.end());
  contender->release();
  for (auto s : streams) check(cudaStreamDestroy(s), "stream destroy");
  uint64_t total = 0;
  for (auto n : ops) total += n;
  return total / std::chrono::duration<double, std::micro>(stop - start).count();
}

// Replays an op list through each named contender in turn, all in this
// process: first `cold` rounds in which each one takes a first pass from an
// empty cache (all released at the round's start), then `turns` turns in which each
// contender takes one untimed pass (its caches and branch predictors warm up
// again after the others' turns) and `timed` timed ones. Returns, per
// contender, each round's first-pass ns per op, each turn's mean ns per op
// over its timed passes, and, where the allocator counts them, its reserved
// bytes after the first round's first pass and the most it reported at the
// end of any of its passes' groups (a cold round's pass, a turn).
//
// All of them hold their caches at once, except the two that share
// PyTorch's allocator: each empties it when its turn begins (`enter`), so
// each of their turns starts from an empty cache, which its untimed pass fills.
//
// A contender that throws (all of them hold their caches at once, so a late
// one can find the device full, or RMM's arena too small) is released and
// left out of the later passes, so that the others still finish: its entry
// says why ("failed") and keeps what it ran before. What its broken pass held
// may stay allocated.
py::dict turns(const std::string& path, const std::vector<std::string>& names, int turns, int timed,
               int cold) {
  auto ops = load_ops(path);
  auto [ids, nstreams] = shape(ops);
  const uint64_t peak = peak_live(ops);
  auto streams = make_streams(nstreams);
  const size_t n = names.size();
  std::vector<std::unique_ptr<Contender>> contenders(n);
  std::vector<std::string> failed(n);
  auto fail = [&](size_t c, const std::exception& e) {
    failed[c] = e.what();
    std::fprintf(stderr, "%s: contender %s failed and is left out from here on: %s\n", path.c_str(),
                 names[c].c_str(), e.what());
    if (!contenders[c]) return;
    try {
      contenders[c]->release();
    } catch (const std::exception&) {
    }
  };
  for (size_t c = 0; c < n; ++c) {
    try {
      contenders[c] = make(names[c], peak);
    } catch (const std::exception& e) {
      fail(c, e);
    }
  }
  std::vector<std::vector<void*>> ptrs(n, std::vector<void*>(ids, nullptr));
  std::vector<uint32_t> stream_of(ids, 0);
  std::vector<py::list> firsts(n);
  std::vector<std::pair<uint64_t, uint64_t>> reserved(n, {0, 0});
  std::vector<py::list> means(n);
  auto pass = [&](size_t c) { return replay_pass(*contenders[c], ops, streams, ptrs[c], stream_of); };
  // Read after each of a contender's turns, while the allocator is still its
  // own (PyTorch's is shared by two contenders).
  auto note_peak = [&](size_t c) {
    reserved[c].second = std::max(reserved[c].second, contenders[c]->reserved().second);
  };
  for (int round = 0; round < cold; ++round) {
    // Every cache empty at each round's start, as before the first: a
    // contender sized by the free memory when it is made (RMM's arena) finds
    // as much in every round.
    for (size_t c = 0; c < n; ++c) {
      if (!failed[c].empty()) continue;
      try {
        contenders[c]->release();
      } catch (const std::exception& e) {
        fail(c, e);
      }
    }
    for (size_t c = 0; c < n; ++c) {
      if (!failed[c].empty()) continue;
      try {
        contenders[c]->enter();
        firsts[c].append(pass(c));
        if (round == 0) reserved[c].first = contenders[c]->reserved().first;
        note_peak(c);
      } catch (const std::exception& e) {
        fail(c, e);
      }
    }
  }
  for (int turn = 0; turn < turns; ++turn) {
    for (size_t c = 0; c < n; ++c) {
      if (!failed[c].empty()) continue;
      try {
        contenders[c]->enter();
        pass(c);
        double sum = 0;
        for (int t = 0; t < timed; ++t) sum += pass(c);
        means[c].append(sum / timed);
        note_peak(c);
      } catch (const std::exception& e) {
        fail(c, e);
      }
    }
  }
  for (size_t c = 0; c < n; ++c) {
    if (!failed[c].empty()) continue;
    try {
      contenders[c]->release();
    } catch (const std::exception& e) {
      fail(c, e);
    }
  }
  destroy_streams(streams);
  py::dict out;
  for (size_t c = 0; c < n; ++c) {
    py::dict r;
    r["firsts"] = firsts[c];
    r["turns"] = means[c];
    // {0, 0}: the allocator counts none (cachalot's plug-in; its own bench does).
    if (reserved[c].first || reserved[c].second) {
      r["reserved_after_first"] = reserved[c].first;
      r["reserved_peak"] = reserved[c].second;
    }
    if (!failed[c].empty()) r["failed"] = failed[c];
    out[py::str(names[c])] = r;
  }
  return out;
}

bool has_rmm() { return kWithRmm; }

// What has_rmm's contenders were built from ("" without them).
std::string rmm_version() {
#ifdef CACHALOT_WITH_RMM
  return cachalot_bench::rmm_version();
#else
  return "";
#endif
}

void set_plugin(const std::string& path) { plugin_path = path; }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("replay", &replay, "replay an op list through a native contender");
  m.def("turns", &turns, "replay an op list through several contenders in turn");
  m.def("set_plugin", &set_plugin, "the cachalot plug-in library for the cachalot:<policy> contenders");
  m.def("scaling", &scaling, "threaded alloc/free pattern, total ops per microsecond");
  m.def("peak_live", [](const std::string& path) { return peak_live(load_ops(path)); },
        "the most requested bytes an op list keeps live at once");
  m.def("has_rmm", &has_rmm, "whether the rmm:pool, rmm:arena and rmm:async contenders were built in");
  m.def("rmm_version", &rmm_version, "the RMM and CCCL versions the rmm contenders were built from");
}

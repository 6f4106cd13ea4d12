// The C++ half of history recording: what PyTorch keeps with each trace event
// besides the event itself (the Python stack its context recorder gathers,
// the compile context, the user's metadata) and the stacks of live blocks.
//
// While recording, each call into the library is tagged (cachalot_set_event_tag)
// with the id of what was gathered for it; the events the call causes come
// back in the snapshot's trace rows with that id. Which calls gather a stack
// follows PyTorch's `context` levels: allocations from "state" on (for live
// blocks; their trace events from "alloc" on), frees and cache releases at
// "all". A free event without a stack of its own shows its allocation's, a
// segment release its segment's allocation's, as in PyTorch.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/ApproximateClock.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cachalot_abi.h"

namespace cachalot {

namespace cca = c10::cuda::CUDACachingAllocator;
using c10::CachingDeviceAllocator::RecordContext;
using c10::CachingDeviceAllocator::TraceEntry;
using Ctx = std::shared_ptr<c10::GatheredContext>;

// What PyTorch keeps with a trace event besides the event.
struct EventTag {
  Ctx context;
  std::string compile_context = "N/A";
  std::string user_metadata;
};

// Which of PyTorch's context levels gathers a call's stack.
enum class CallKind { Alloc, Other };

// Event times: the library stamps microseconds since the Unix epoch; PyTorch's
// trace entries hold c10's approximate clock, which the snapshot converts back.
struct ClockMap {
  c10::ApproximateClockToUnixTimeConverter::UnixAndApproximateTimePair start =
      c10::ApproximateClockToUnixTimeConverter::measurePair();

  c10::approx_time_t to_approx(uint64_t unix_us) const {
    auto now = c10::ApproximateClockToUnixTimeConverter::measurePair();
    double span_ns = double(now.t_ - start.t_);
    double ticks_per_ns = span_ns > 0 ? double(now.approx_t_ - start.approx_t_) / span_ns : 1.0;
    double back_ns = double(now.t_) - double(unix_us) * 1000.0;
    return static_cast<c10::approx_time_t>(double(now.approx_t_) - back_ns * ticks_per_ns);
  }
};

class History {
 public:
  void configure(bool enabled, cca::CreateContextFn recorder, RecordContext when, size_t max_entries, bool clear) {
    std::lock_guard<std::mutex> lock(mu_);
    bool was_on = on_.load();
    recorder_ = enabled ? recorder : nullptr;
    when_ = enabled ? when : RecordContext::NEVER;
    max_entries_ = max_entries;
    // The library starts a fresh trace when recording starts, or when asked.
    if (clear || (enabled && !was_on)) {
      first_id_ += tags_.size();
      tags_.clear();
    }
    if (!enabled) {
      live_.clear();
    }
    on_.store(enabled);
  }

  bool active() const {
    return on_.load(std::memory_order_relaxed);
  }

  // Gathers what a call of `kind` records and returns its tag's id (0 when
  // not recording) with the stack a new block keeps.
  std::pair<uint64_t, Ctx> begin(CallKind kind) {
    cca::CreateContextFn recorder;
    RecordContext when;
    {
      std::lock_guard<std::mutex> lock(mu_);
      recorder = recorder_;
      when = when_;
    }
    bool wanted = kind == CallKind::Alloc ? when >= RecordContext::STATE : when == RecordContext::ALL;
    Ctx ctx = wanted && recorder ? recorder() : nullptr;
    bool traced = kind == CallKind::Alloc ? when >= RecordContext::ALLOC : wanted;
    std::lock_guard<std::mutex> lock(mu_);
    tags_.push_back(EventTag{
        traced ? ctx : nullptr,
        compile_contexts_.empty() ? std::string("N/A") : compile_contexts_.back(),
        user_metadata_});
    if (max_entries_ > 0 && tags_.size() > max_entries_) {
      tags_.pop_front();
      ++first_id_;
    }
    return {first_id_ + tags_.size() - 1, std::move(ctx)};
  }

  void push_compile_context(const std::string& context) {
    std::lock_guard<std::mutex> lock(mu_);
    compile_contexts_.push_back(context);
  }

  void pop_compile_context() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!compile_contexts_.empty()) {
      compile_contexts_.pop_back();
    }
  }

  void set_user_metadata(const std::string& metadata) {
    std::lock_guard<std::mutex> lock(mu_);
    user_metadata_ = metadata;
  }

  std::string user_metadata() {
    std::lock_guard<std::mutex> lock(mu_);
    return user_metadata_;
  }

  void on_alloc(void* ptr, Ctx ctx) {
    if (ptr == nullptr || !ctx) {
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    live_[ptr] = std::move(ctx);
  }

  void on_free(void* ptr) {
    if (!active()) {
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(ptr);
  }

  Ctx of_block(uint64_t address) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(reinterpret_cast<void*>(address));
    return it == live_.end() ? nullptr : it->second;
  }

  // What each trace row carries, oldest first (see the file's comment).
  std::vector<EventTag> resolve(const cachalot_trace_row* rows, size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<EventTag> out(n);
    std::unordered_map<uint64_t, Ctx> allocs, segments;
    for (size_t i = 0; i < n; ++i) {
      const auto& row = rows[i];
      if (row.tag >= first_id_ && row.tag - first_id_ < tags_.size()) {
        out[i] = tags_[row.tag - first_id_];
      }
      inherit(static_cast<TraceEntry::Action>(row.action), row.addr, out[i].context, allocs, segments);
    }
    return out;
  }

 private:
  // A free without a stack shows its allocation's; a release its segment's.
  static void inherit(
      TraceEntry::Action action,
      uint64_t addr,
      Ctx& ctx,
      std::unordered_map<uint64_t, Ctx>& allocs,
      std::unordered_map<uint64_t, Ctx>& segments) {
    auto fill = [&](std::unordered_map<uint64_t, Ctx>& from) {
      auto it = from.find(addr);
      if (!ctx && it != from.end()) {
        ctx = it->second;
      }
    };
    switch (action) {
      case TraceEntry::ALLOC:
        allocs[addr] = ctx;
        break;
      case TraceEntry::SEGMENT_ALLOC:
      case TraceEntry::SEGMENT_MAP:
        segments[addr] = ctx;
        break;
      case TraceEntry::FREE_REQUESTED:
      case TraceEntry::FREE_COMPLETED:
        fill(allocs);
        break;
      case TraceEntry::SEGMENT_FREE:
      case TraceEntry::SEGMENT_UNMAP:
        fill(segments);
        break;
      default:
        break;
    }
  }

  std::mutex mu_;
  std::atomic<bool> on_{false};
  cca::CreateContextFn recorder_ = nullptr;
  RecordContext when_ = RecordContext::NEVER;
  size_t max_entries_ = 0;
  std::deque<EventTag> tags_;
  uint64_t first_id_ = 1;  // tag ids start at 1: 0 is "untagged"
  std::vector<std::string> compile_contexts_;
  std::string user_metadata_;
  std::unordered_map<void*, Ctx> live_;
};

// Tags the calling thread's calls into the library for as long as it lives.
class TaggedCall {
 public:
  TaggedCall(History& history, CallKind kind) {
    if (!history.active()) {
      return;
    }
    auto [id, ctx] = history.begin(kind);
    ctx_ = std::move(ctx);
    cachalot_set_event_tag(id);
    tagged_ = true;
  }
  ~TaggedCall() {
    if (tagged_) {
      cachalot_set_event_tag(0);
    }
  }
  TaggedCall(const TaggedCall&) = delete;
  TaggedCall& operator=(const TaggedCall&) = delete;

  // The stack gathered for the call, if any.
  const Ctx& context() const {
    return ctx_;
  }

 private:
  Ctx ctx_;
  bool tagged_ = false;
};

} // namespace cachalot

// The simulated core's accounting in C++: its HBM caching allocator and its timeline (host
// time, in-order device queues, engine busy time). One implementation, used by Python
// (simulator/native.py builds simulator/native.cpp, its bindings: simulator/memory.py, simulator/device.py) and by the C++
// door (client/door/fast_door.cpp includes this header and accounts a warm eager call with
// the same objects, without a Python call per step). Header only, no torch, no Python.
//
// The allocator is PyTorch's CUDA caching allocator in outline: best fit from cached blocks,
// split and coalesce, small and large pools, freed blocks parked by exact size for the next
// request of that size (a training loop's common case), cached segments released before a
// request fails. The timeline: each launch starts at the later of the host's time and its
// queue's end, and lasts the launch overhead plus its modelled time (docs/ARCHITECTURE.md,
// "Two clocks"). Everything is deterministic. Nothing here is thread-safe: every caller
// holds Python's GIL.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace trnsim {

constexpr int64_t kMiB = int64_t(1) << 20;
constexpr int64_t kAlignment = 512;              // every block is a multiple of this many bytes
constexpr int64_t kSmallRequest = 1 * kMiB;      // requests up to this size: the small pool
constexpr int64_t kSmallSegment = 2 * kMiB;      // segment size of the small pool
constexpr int64_t kMediumSegment = 20 * kMiB;    // large requests below 10 MiB share these
constexpr int64_t kMediumRequest = 10 * kMiB;
constexpr int64_t kLargeRounding = 2 * kMiB;     // larger ones: their size rounded up to this

inline int64_t round_size(int64_t size) {
  return std::max(kAlignment, (size + kAlignment - 1) / kAlignment * kAlignment);
}

inline int64_t segment_size(int64_t rounded) {
  if (rounded <= kSmallRequest) return kSmallSegment;
  if (rounded < kMediumRequest) return kMediumSegment;
  return (rounded + kLargeRounding - 1) / kLargeRounding * kLargeRounding;
}

struct Block;

struct Segment {
  int64_t offset, size;
  bool small;
  int64_t blocks_in_use = 0;
  std::shared_ptr<Block> head;  // the block at its start: blocks merge into it
};

// A piece of a segment: handed out (allocated), cached for reuse, or parked. Python holds
// handed-out blocks by shared_ptr, so a handle outlives a merge (its `allocated` is then
// false: freeing it again is a double free, not a crash).
struct Block : std::enable_shared_from_this<Block> {
  Segment* segment;  // (valid while it is allocated, cached or parked)
  int64_t segment_offset;  // (its segment's address, readable after the segment is gone)
  int64_t offset, size;
  int64_t requested = 0;
  int64_t id = 0;  // its handle while allocated by take() (never reused), else 0
  bool allocated = false;
  bool cached = false;  // in its pool, for reuse
  Block* prev = nullptr;
  std::shared_ptr<Block> next;
  Block(Segment* s, int64_t o, int64_t n) : segment(s), segment_offset(s->offset), offset(o), size(n) {}
};

// The allocator refused a request: the sizes the error names.
struct OutOfMemory {
  int64_t requested, allocated, reserved, capacity, limit;
};

// The allocator's counters, in the order memory_stats() lists them.
struct Counters {
  int64_t allocated_bytes = 0, requested_bytes = 0, reserved_bytes = 0;
  int64_t peak_allocated_bytes = 0, peak_reserved_bytes = 0;
  int64_t num_allocs = 0, num_frees = 0, num_segment_allocs = 0, num_segment_frees = 0;
  int64_t num_ooms = 0, num_cache_flushes = 0;
};

// First-fit ranges of the core's HBM address space, handed out as segments.
class AddressSpace {
 public:
  explicit AddressSpace(int64_t capacity) { free_[0] = capacity; }

  bool take(int64_t size, int64_t& offset) {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second >= size) {
        offset = it->first;
        const int64_t rest = it->second - size;
        free_.erase(it);
        if (rest) free_[offset + size] = rest;
        return true;
      }
    }
    return false;
  }

  void give_back(int64_t offset, int64_t size) {
    auto next = free_.lower_bound(offset);
    if (next != free_.end() && offset + size == next->first) {
      size += next->second;
      free_.erase(next);
    }
    auto after = free_.lower_bound(offset);
    if (after != free_.begin()) {
      auto before = std::prev(after);
      if (before->first + before->second == offset) {
        before->second += size;
        return;
      }
    }
    free_[offset] = size;
  }

  int64_t largest_free() const {
    int64_t most = 0;
    for (const auto& [offset, size] : free_) most = std::max(most, size);
    return most;
  }

 private:
  std::map<int64_t, int64_t> free_;  // offset -> size
};

class Allocator {
 public:
  const int64_t capacity;
  int64_t limit;  // reserved bytes may not pass it (set_per_process_memory_fraction)
  Counters c;

  explicit Allocator(int64_t cap) : capacity(cap), limit(cap), space_(cap) {}

  // A block of at least `size` bytes (throws OutOfMemory).
  std::shared_ptr<Block> malloc(int64_t size) {
    if (size > capacity) {  // (no segment can hold it; and its rounding would overflow)
      unpark();
      c.num_cache_flushes += 1;
      empty_cache();
      c.num_ooms += 1;
      throw OutOfMemory{size, c.allocated_bytes, c.reserved_bytes, capacity, limit};
    }
    const int64_t rounded = round_size(size);
    auto parked = parked_.find(rounded);
    if (parked != parked_.end() && !parked->second.empty()) {  // (every op's output)
      Block* reused = parked->second.back();
      parked->second.pop_back();
      --n_parked_;
      return hand_out(reused, size);
    }
    unpark();
    const bool small = rounded <= kSmallRequest;
    Block* block = take_cached(small, rounded);
    if (block == nullptr) block = new_segment(small, rounded);
    if (block == nullptr) {
      c.num_cache_flushes += 1;
      empty_cache();
      block = new_segment(small, rounded);
    }
    if (block == nullptr) {
      c.num_ooms += 1;
      throw OutOfMemory{size, c.allocated_bytes, c.reserved_bytes, capacity, limit};
    }
    split(block, rounded, small);
    return hand_out(block, size);
  }

  // malloc() of a block known by a handle (a number never handed out again), which is all
  // the runtime holds of it: cheaper to pass around than a block, and a stale handle is
  // refused rather than freeing someone else's block.
  int64_t take(int64_t size) {
    Block* block = malloc(size).get();
    block->id = next_id_++;
    live_[block->id] = block;
    return block->id;
  }

  // free() of the block a handle names (false: none, a double free).
  bool give(int64_t id) {
    auto it = live_.find(id);
    if (it == live_.end()) return false;
    Block* block = it->second;
    live_.erase(it);
    block->id = 0;
    return free(block);
  }

  // The block a handle names while it is allocated (else nullptr).
  const Block* find(int64_t id) const {
    auto it = live_.find(id);
    return it == live_.end() ? nullptr : it->second;
  }

  // False: the block is not allocated (a double free).
  bool free(Block* block) {
    if (!block->allocated) return false;
    block->allocated = false;
    block->segment->blocks_in_use -= 1;
    c.allocated_bytes -= block->size;
    c.requested_bytes -= block->requested;
    c.num_frees += 1;
    block->requested = 0;
    parked_[block->size].push_back(block);
    ++n_parked_;
    return true;
  }

  // Releases every cached segment that holds no allocated block.
  void empty_cache() {
    unpark();
    for (size_t i = 0; i < segments_.size();) {
      Segment* segment = segments_[i].get();
      if (segment->blocks_in_use) {
        ++i;
        continue;
      }
      for (Block* b = segment->head.get(); b != nullptr; b = b->next.get()) {
        if (b->cached) uncache(b);
      }
      space_.give_back(segment->offset, segment->size);
      c.reserved_bytes -= segment->size;
      c.num_segment_frees += 1;
      segments_.erase(segments_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }

  void reset_peak_stats() {
    c.peak_allocated_bytes = c.allocated_bytes;
    c.peak_reserved_bytes = c.reserved_bytes;
  }

  void reset_accumulated_stats() {
    c.num_allocs = c.num_frees = c.num_segment_allocs = c.num_segment_frees = 0;
    c.num_ooms = c.num_cache_flushes = 0;
  }

  // Fragmentation: bytes cached, bytes cached in segments that hold an allocated block.
  std::pair<int64_t, int64_t> cached_bytes() {
    unpark();
    int64_t cached = 0, inactive_split = 0;
    for (const auto* pool : {&small_, &large_}) {
      for (const auto& [key, b] : *pool) {
        cached += b->size;
        if (b->segment->blocks_in_use) inactive_split += b->size;
      }
    }
    return {cached, inactive_split};
  }

  int64_t segments() const { return static_cast<int64_t>(segments_.size()); }
  int64_t largest_free_range() const { return space_.largest_free(); }

  // Every segment in address order (snapshot()).
  std::vector<const Segment*> segments_by_address() {
    unpark();
    std::vector<const Segment*> out;
    for (const auto& s : segments_) out.push_back(s.get());
    std::sort(out.begin(), out.end(),
              [](const Segment* a, const Segment* b) { return a->offset < b->offset; });
    return out;
  }

 private:
  using Pool = std::map<std::pair<int64_t, int64_t>, Block*>;  // (size, offset): best fit
  AddressSpace space_;
  Pool small_, large_;
  std::vector<std::unique_ptr<Segment>> segments_;
  // Freed blocks by exact size; any other request first returns them to the pools.
  std::unordered_map<int64_t, std::vector<Block*>> parked_;
  int64_t n_parked_ = 0;
  std::unordered_map<int64_t, Block*> live_;  // take()'s handles of allocated blocks
  int64_t next_id_ = 1;

  Pool& pool(const Block* b) { return b->segment->small ? small_ : large_; }

  // The block, of its final size, allocated for a request of `size` bytes, and counted.
  std::shared_ptr<Block> hand_out(Block* block, int64_t size) {
    block->allocated = true;
    block->requested = size;
    block->segment->blocks_in_use += 1;
    c.allocated_bytes += block->size;
    c.requested_bytes += size;
    c.peak_allocated_bytes = std::max(c.peak_allocated_bytes, c.allocated_bytes);
    c.num_allocs += 1;
    return block->shared_from_this();
  }

  void unpark() {
    if (!n_parked_) return;
    std::vector<Block*> parked;
    for (auto& [size, blocks] : parked_) parked.insert(parked.end(), blocks.begin(), blocks.end());
    parked_.clear();
    n_parked_ = 0;
    for (Block* b : parked) cache(b);
    // (a parked block merged into an earlier one is uncached; the survivor holds the chain)
    std::vector<std::shared_ptr<Block>> alive;
    for (Block* b : parked) alive.push_back(b->shared_from_this());
    for (Block* b : parked) {
      if (b->cached && ((b->prev && b->prev->cached) || (b->next && b->next->cached))) {
        uncache(b);
        cache(coalesce(b));
      }
    }
  }

  Block* take_cached(bool small, int64_t rounded) {
    Pool& p = small ? small_ : large_;
    auto it = p.lower_bound({rounded, -1});
    if (it == p.end()) return nullptr;
    Block* block = it->second;
    p.erase(it);
    block->cached = false;
    // (as the CUDA allocator: no small request carved out of an oversized large block)
    if (!small && rounded < kMediumRequest && block->size >= kMediumRequest * 2) {
      cache(block);
      return nullptr;
    }
    return block;
  }

  Block* new_segment(bool small, int64_t rounded) {
    const int64_t size = segment_size(rounded);
    if (c.reserved_bytes + size > limit) return nullptr;
    int64_t offset = 0;
    if (!space_.take(size, offset)) return nullptr;
    auto segment = std::make_unique<Segment>(Segment{offset, size, small});
    segment->head = std::make_shared<Block>(segment.get(), offset, size);
    Block* head = segment->head.get();
    segments_.push_back(std::move(segment));
    c.reserved_bytes += size;
    c.peak_reserved_bytes = std::max(c.peak_reserved_bytes, c.reserved_bytes);
    c.num_segment_allocs += 1;
    return head;
  }

  void split(Block* block, int64_t rounded, bool small) {
    const int64_t remaining = block->size - rounded;
    if (remaining < (small ? kAlignment : kSmallRequest)) return;
    auto rest = std::make_shared<Block>(block->segment, block->offset + rounded, remaining);
    rest->prev = block;
    rest->next = block->next;
    if (block->next) block->next->prev = rest.get();
    block->next = rest;
    block->size = rounded;
    cache(rest.get());
  }

  // Merges the block with every free cached neighbour on both sides.
  Block* coalesce(Block* block) {
    while (block->prev != nullptr && block->prev->cached) {
      Block* prev = block->prev;
      uncache(prev);
      prev->size += block->size;
      std::shared_ptr<Block> next = block->next;
      if (next) next->prev = prev;
      prev->next = std::move(next);  // (drops the chain's hold on block)
      block = prev;
    }
    while (block->next && block->next->cached) {
      std::shared_ptr<Block> nxt = block->next;
      uncache(nxt.get());
      block->size += nxt->size;
      block->next = nxt->next;
      if (block->next) block->next->prev = block;
    }
    return block;
  }

  void cache(Block* block) {
    pool(block)[{block->size, block->offset}] = block;
    block->cached = true;
  }

  void uncache(Block* block) {
    pool(block).erase({block->size, block->offset});
    block->cached = false;
  }
};

// -- the timeline ---------------------------------------------------------------------------
// An engine's index in every timeline's busy counts (tensor, vector, scalar, gpsimd, dma,
// collective, and any other a cost names), in the order first seen.
inline std::vector<std::string>& engine_names() {
  static auto* names = new std::vector<std::string>{"tensor", "vector", "scalar",
                                                    "gpsimd", "dma",    "collective"};
  return *names;
}

inline int engine_index(const std::string& name) {
  auto& names = engine_names();
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<int>(i);
  }
  names.push_back(name);
  return static_cast<int>(names.size() - 1);
}

// What an executable costs on the timeline: its modelled time, the engines' busy time and
// its HBM traffic (made once per loaded executable).
struct Cost {
  int64_t modelled_ns = 0, hbm_bytes = 0;
  std::vector<std::pair<int, int64_t>> engines;  // (engine_index, ns)
};

struct Queue {
  int64_t end_ns = 0;
  // Ends of launches not known to be finished (non-decreasing); entries at or before the
  // host's time go as the host moves on, so it stays short.
  std::deque<int64_t> ends;
  int64_t busy_ns = 0;
};

class Timeline {
 public:
  const int64_t launch_overhead_ns;
  int64_t host_ns = 0, host_busy_ns = 0, sync_waits = 0, sync_wait_ns = 0, launches = 0;
  int64_t collective_overlap_ns = 0;  // compute that ran while a collective did
  int64_t hbm_bytes = 0;  // bytes the launched work moves to and from HBM (modelled)
  std::vector<int64_t> engine_busy_ns;  // by engine_index

  explicit Timeline(int64_t overhead) : launch_overhead_ns(overhead) {}

  // The host spends ns (dispatching, recording, submitting).
  void host_work(int64_t ns) {
    host_ns += ns;
    host_busy_ns += ns;
  }

  // Work of duration_ns (+ the launch overhead: the target's when overhead_ns < 0) on a
  // stream's queue, after host_ns of host work: it starts when the host submits it or the
  // stream's earlier work ends, whichever is later. Returns its start.
  int64_t enqueue(int64_t duration_ns, int64_t stream,
                  const std::vector<std::pair<int, int64_t>>& engines, int64_t overhead_ns,
                  int64_t submit_ns, int64_t traffic = 0) {
    const int64_t overhead = overhead_ns < 0 ? launch_overhead_ns : overhead_ns;
    Queue& q = queues_[stream];
    if (submit_ns) host_work(submit_ns);
    const int64_t host = host_ns;
    const int64_t start = q.end_ns > host ? q.end_ns : host;
    const int64_t end = start + overhead + duration_ns;
    q.end_ns = end;
    q.ends.push_back(end);
    while (!q.ends.empty() && q.ends.front() <= host) q.ends.pop_front();
    q.busy_ns += end - start;
    if (!spans_.empty()) {  // compute launched while collectives run or are queued
      while (!spans_.empty() && spans_.front().second <= start) spans_.pop_front();
      for (const auto& [c_start, c_end] : spans_) {
        collective_overlap_ns += std::max<int64_t>(0, std::min(end, c_end) - std::max(start, c_start));
      }
    }
    launches += 1;
    hbm_bytes += traffic;
    for (const auto& [engine, ns] : engines) busy(engine) += ns;
    return start;
  }

  // A launch of an executable after submit_ns of host work (the runtime's per-op path, and
  // the C++ door's): an executable that models no time costs the host only (returns -1).
  int64_t launch(const Cost& cost, int64_t stream, int64_t submit_ns) {
    if (!cost.modelled_ns) {
      host_work(submit_ns);
      return -1;
    }
    return enqueue(cost.modelled_ns, stream, cost.engines, -1, submit_ns, cost.hbm_bytes);
  }

  int64_t stream_end_ns(int64_t stream) const {
    auto it = queues_.find(stream);
    return it == queues_.end() ? 0 : it->second.end_ns;
  }

  // When work submitted now on a stream could start.
  int64_t ready_ns(int64_t stream) const { return std::max(host_ns, stream_end_ns(stream)); }

  // Work whose start was agreed elsewhere (a collective: the last rank's arrival) runs on a
  // stream from start_ns, no earlier than the stream is ready (false: it is earlier).
  bool occupy(int64_t stream, int64_t start_ns, int64_t duration_ns, int engine) {
    Queue& q = queues_[stream];
    if (start_ns < std::max(host_ns, q.end_ns)) return false;
    const int64_t end = start_ns + duration_ns;
    q.end_ns = end;
    q.ends.push_back(end);
    q.busy_ns += duration_ns;
    busy(engine) += duration_ns;
    if (!spans_.empty() && start_ns < spans_.back().second) {  // (still running: one span)
      spans_.back().second = std::max(end, spans_.back().second);
    } else {
      spans_.emplace_back(start_ns, end);
    }
    return true;
  }

  // Launches submitted and not finished at the host's time (stream < 0: on every stream).
  int64_t queue_depth(int64_t stream) {
    int64_t n = 0;
    for (auto& [s, q] : queues_) {
      if (stream >= 0 && s != stream) continue;
      while (!q.ends.empty() && q.ends.front() <= host_ns) q.ends.pop_front();
      n += static_cast<int64_t>(q.ends.size());
    }
    return n;
  }

  // Busy time of a stream (stream < 0: summed over every stream).
  int64_t device_busy_ns(int64_t stream) const {
    int64_t n = 0;
    for (const auto& [s, q] : queues_) {
      if (stream < 0 || s == stream) n += q.busy_ns;
    }
    return n;
  }

  // The host waits for a stream (stream < 0: every stream); returns the ns it waited.
  int64_t synchronize(int64_t stream) {
    int64_t end = 0;
    for (const auto& [s, q] : queues_) {
      if (stream < 0 || s == stream) end = std::max(end, q.end_ns);
    }
    return wait_until(end);
  }

  int64_t wait_until(int64_t time_ns) {
    sync_waits += 1;
    const int64_t waited = std::max<int64_t>(0, time_ns - host_ns);
    host_ns += waited;
    sync_wait_ns += waited;
    return waited;
  }

  // Later work on the stream waits for time_ns (a device-side wait; the host goes on).
  void stream_wait(int64_t stream, int64_t time_ns) {
    Queue& q = queues_[stream];
    q.end_ns = std::max(q.end_ns, time_ns);
  }

  // Launches, sync waits and busy times to zero; the clocks go on.
  void reset_counters() {
    host_busy_ns = sync_waits = sync_wait_ns = launches = collective_overlap_ns = hbm_bytes = 0;
    std::fill(engine_busy_ns.begin(), engine_busy_ns.end(), 0);
    for (auto& [s, q] : queues_) q.busy_ns = 0;
  }

  // Simulated wall time: the later of the host and every queue's end.
  int64_t now_ns() const {
    int64_t now = host_ns;
    for (const auto& [s, q] : queues_) now = std::max(now, q.end_ns);
    return now;
  }

  int64_t engine_busy(int engine) const {
    return engine < static_cast<int>(engine_busy_ns.size()) ? engine_busy_ns[engine] : 0;
  }

 private:
  std::map<int64_t, Queue> queues_;
  // Collectives on the timeline (start, end), latest last.
  std::deque<std::pair<int64_t, int64_t>> spans_;

  int64_t& busy(int engine) {
    if (engine >= static_cast<int>(engine_busy_ns.size())) engine_busy_ns.resize(engine + 1, 0);
    return engine_busy_ns[engine];
  }
};

}  // namespace trnsim

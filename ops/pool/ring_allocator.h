// First-in first-out placement of regions in a fixed-size ring, pure offset arithmetic.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <optional>

namespace instanttensor::pool {

// Regions are allocated at the head and released only from the tail (oldest first), which is the
// order the loader hands tensors out in. Not thread-safe: the loader uses it from the consumer's
// thread only.
class RingAllocator {
 public:
  // capacity > 0 bytes; alignment a power of two.
  RingAllocator(uint64_t capacity, uint64_t alignment);

  // Places a region of `size` > 0 bytes whose start s satisfies s % alignment == phase %
  // alignment (so data keeps its alignment relative to the file), contiguous (never split across
  // the end). Returns the start offset, or nullopt when it does not fit without releasing.
  std::optional<uint64_t> allocate(uint64_t size, uint64_t phase);
  // Releases the oldest region. Precondition: !empty().
  void release_oldest();

  bool empty() const { return regions_.empty(); }
  size_t region_count() const { return regions_.size(); }
  uint64_t capacity() const { return capacity_; }
  // Regions are placed below `limit` (at most the capacity; at first the capacity): memory past
  // it is never touched until the limit is raised, which may happen at any time.
  void set_limit(uint64_t limit) { limit_ = std::min(std::max<uint64_t>(limit, 1), capacity_); }
  uint64_t limit() const { return limit_; }
  // Worst-case bytes lost to alignment per region: requests should budget size + this.
  uint64_t alignment_slack() const { return alignment_ - 1; }

 private:
  struct Region {
    uint64_t begin;
    uint64_t end;
  };
  uint64_t aligned_from(uint64_t from, uint64_t phase) const;

  uint64_t capacity_;
  uint64_t limit_;
  uint64_t alignment_;
  std::deque<Region> regions_;
};

}  // namespace instanttensor::pool

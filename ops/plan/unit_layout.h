// How the bytes of a read group are cut into exchange units and per-rank slices, torch-free.
#pragma once

#include <cstddef>
#include <cstdint>

namespace instanttensor::plan {

// How a read group is cut for the exchange: units of at most `unit_bytes` (a multiple of
// world x kSliceAlignment), each cut into `world` equal slices; the last unit of a group is
// padded so that its slices are equal too (the all-gather writes up to `padding()` bytes past
// the group's end, which its destination reserves).
struct UnitLayout {
  static constexpr uint64_t kSliceAlignment = 64;
  uint64_t unit_bytes = 0;
  int world = 1;
  // Units of `world` shares of about `share_bytes` (exchange_share_bytes, memory_plan.h).
  UnitLayout(uint64_t share_bytes, int world);
  size_t unit_count(uint64_t group_bytes) const;
  // Unit `u` of a group of `group_bytes`: [begin, end) in the group, and its slice size.
  struct Unit {
    uint64_t begin = 0;
    uint64_t end = 0;
    uint64_t slice = 0;
    // Rank r's share: [begin + r x slice, ...) clipped to the unit; may be empty.
    uint64_t share_begin(int rank) const;
    uint64_t share_end(int rank) const;
  };
  Unit unit(uint64_t group_bytes, size_t u) const;
  uint64_t padding() const { return static_cast<uint64_t>(world) * kSliceAlignment; }
};

}  // namespace instanttensor::plan

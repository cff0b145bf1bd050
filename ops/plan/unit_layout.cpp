#include "plan/unit_layout.h"

#include <algorithm>

#include "plan/read_plan.h"

namespace instanttensor::plan {

using plan::round_up;

UnitLayout::UnitLayout(uint64_t share_bytes, int world_size) : world(world_size) {
  uint64_t step = static_cast<uint64_t>(world) * kSliceAlignment;
  unit_bytes = std::max<uint64_t>(1, share_bytes / kSliceAlignment) * step;
}

size_t UnitLayout::unit_count(uint64_t group_bytes) const {
  return static_cast<size_t>((group_bytes + unit_bytes - 1) / unit_bytes);
}

UnitLayout::Unit UnitLayout::unit(uint64_t group_bytes, size_t u) const {
  Unit out;
  out.begin = static_cast<uint64_t>(u) * unit_bytes;
  out.end = std::min(group_bytes, out.begin + unit_bytes);
  uint64_t per_rank = (out.end - out.begin + world - 1) / static_cast<uint64_t>(world);
  out.slice = world == 1 ? out.end - out.begin : round_up(per_rank, kSliceAlignment);
  return out;
}

uint64_t UnitLayout::Unit::share_begin(int rank) const {
  return std::min(end, begin + static_cast<uint64_t>(rank) * slice);
}

uint64_t UnitLayout::Unit::share_end(int rank) const {
  return std::min(end, begin + static_cast<uint64_t>(rank + 1) * slice);
}

}  // namespace instanttensor::plan

// Cutting a read group into units of equal rank slices (plan/unit_layout.h): pure, torch-free.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "plan/unit_layout.h"

namespace instanttensor::loader {
namespace {

TEST(UnitLayout, EqualSlicesCoverEveryByteOnceWithBoundedPadding) {
  for (int world : {1, 2, 3, 8}) {
    for (uint64_t chunk : {64ull, 4096ull, 1000ull, 8ull << 20}) {
      plan::UnitLayout layout(chunk, world);
      EXPECT_EQ(layout.unit_bytes % (static_cast<uint64_t>(world) * 64), 0u);
      for (uint64_t group : {1ull, 63ull, 64ull, 65ull, 1000ull, 12345ull, 3ull * layout.unit_bytes,
                             3ull * layout.unit_bytes + 7}) {
        SCOPED_TRACE("world " + std::to_string(world) + " chunk " + std::to_string(chunk) +
                     " group " + std::to_string(group));
        uint64_t covered = 0;
        for (size_t u = 0; u < layout.unit_count(group); ++u) {
          auto unit = layout.unit(group, u);
          EXPECT_EQ(unit.begin, covered);
          EXPECT_GT(unit.end, unit.begin);
          EXPECT_LE(unit.begin + unit.slice * world,
                    unit.begin + (unit.end - unit.begin) + (world == 1 ? 0 : layout.padding()));
          if (world > 1) {
            EXPECT_EQ(unit.slice % plan::UnitLayout::kSliceAlignment, 0u);
          }
          uint64_t shares = 0;
          for (int r = 0; r < world; ++r) {
            EXPECT_LE(unit.share_begin(r), unit.share_end(r));
            EXPECT_EQ(unit.share_begin(r),
                      unit.begin + std::min(unit.end - unit.begin, r * unit.slice));
            shares += unit.share_end(r) - unit.share_begin(r);
          }
          EXPECT_EQ(shares, unit.end - unit.begin);
          covered = unit.end;
        }
        EXPECT_EQ(covered, group);
      }
    }
  }
  EXPECT_EQ(plan::UnitLayout(4096, 2).unit_count(0), 0u);
}

}  // namespace
}  // namespace instanttensor::loader

// Sizing the rings and grouping the reads (plan/memory_plan.h): a pure function, checked case
// by case without allocating anything.
#include <gtest/gtest.h>

#include "instanttensor/error.h"
#include "plan/memory_plan.h"

namespace instanttensor::loader {
namespace {

std::pair<std::string, std::string> name_of(size_t i) {
  return {"m.safetensors", "t" + std::to_string(i)};
}

plan::MemoryInputs inputs(std::vector<uint64_t> sizes) {
  plan::MemoryInputs in;
  in.tensor_bytes = std::move(sizes);
  return in;
}

std::string error_of(const plan::MemoryInputs& in) {
  try {
    plan::plan_memory(in, name_of, "m.safetensors");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Argument);
    return e.what();
  }
  return "accepted";
}

TEST(MemoryPlan, CpuCopyReadsAheadIntoOwnedStorageOnly) {
  auto plan = plan::plan_memory(inputs({100, 5000, 7}), name_of, "m.safetensors");
  EXPECT_EQ(plan.buffer_size, 5107u);  // the whole selection: less than the read-ahead
  EXPECT_EQ(plan.host_ring_bytes, 0u);
  EXPECT_EQ(plan.max_group_bytes, 0u);  // one tensor per group, read into its own storage
}

TEST(MemoryPlan, BorrowRingHoldsTwoOfTheLargestAndNamesOneThatCannotFit) {
  auto in = inputs({100, 300 << 20, 7});
  in.copy = false;
  auto plan = plan::plan_memory(in, name_of, "m.safetensors");
  EXPECT_GE(plan.host_ring_bytes, 2 * (300ull << 20));
  EXPECT_LE(plan.max_group_bytes, plan.host_ring_bytes / 4);
  in.buffer_size = 1 << 20;
  std::string message = error_of(in);
  EXPECT_NE(message.find("'t1'"), std::string::npos) << message;
  EXPECT_NE(message.find("buffer_size=1048576"), std::string::npos) << message;
}

TEST(MemoryPlan, ExchangeReservesPaddingAndGroupsByUnits) {
  auto in = inputs({1000, 64 << 20, 3});
  in.copy = true;  // distributed: through the ring even for copy=true
  in.world = 3;
  in.chunk_size = 1 << 20;
  auto plan = plan::plan_memory(in, name_of, "m.safetensors");
  EXPECT_GT(plan.host_ring_bytes, 0u);
  EXPECT_EQ(plan.layout.world, 3);
  EXPECT_EQ(plan.layout.unit_bytes % (3 * plan::UnitLayout::kSliceAlignment), 0u);
  EXPECT_LE(plan.max_group_bytes, plan.layout.unit_bytes);
  EXPECT_GE(plan.host_ring_bytes, (64ull << 20) + plan.layout.padding());
}

TEST(MemoryPlan, RanksShareUnitsOfSeveralReadsAndOneRankReadsOneSlice) {
  constexpr uint64_t MiB = 1 << 20;
  EXPECT_EQ(plan::exchange_share_bytes(8 * MiB, 1), 8 * MiB);   // a rank alone: one read
  EXPECT_EQ(plan::exchange_share_bytes(8 * MiB, 2), 32 * MiB);  // up to 32 MiB
  EXPECT_EQ(plan::exchange_share_bytes(3 * MiB, 8), 12 * MiB);  // at most 4 pieces
  EXPECT_EQ(plan::exchange_share_bytes(4096, 2), 4u * 4096);
  EXPECT_EQ(plan::exchange_share_bytes(48 * MiB, 2), 48 * MiB);  // at least one piece
  auto in = inputs({1000, 64 << 20, 3});
  in.staged = true;
  auto alone = plan::plan_memory(in, name_of, "m.safetensors");
  EXPECT_EQ(alone.layout.unit_bytes, alone.staging_slice);
  in.world = 2;
  auto ranks = plan::plan_memory(in, name_of, "m.safetensors");
  EXPECT_EQ(ranks.staging_slice, alone.staging_slice);  // reads as large as alone
  EXPECT_EQ(ranks.layout.unit_bytes, 2 * plan::exchange_share_bytes(ranks.staging_slice, 2));
  EXPECT_LE(ranks.max_group_bytes, ranks.layout.unit_bytes);
}

TEST(MemoryPlan, StagingIsSmallAndFixedWhateverTheTensors) {
  auto in = inputs({4ull << 30, 1 << 20});  // a 4 GiB tensor
  in.staged = true;
  auto plan = plan::plan_memory(in, name_of, "m.safetensors");
  EXPECT_EQ(plan.staging_bytes, plan::defaults::kStagingBytes);
  EXPECT_LE(plan.staging_slice, plan.staging_bytes / 2);  // reads stream through it
  EXPECT_EQ(plan.layout.unit_bytes, plan.staging_slice);
  in.staging_size = 1024;
  EXPECT_NE(error_of(in).find("staging_size=1024 bytes is below"), std::string::npos);
  in.staging_size = plan::kMinStagingBytes;
  EXPECT_EQ(plan::plan_memory(in, name_of, "m").staging_bytes, plan::kMinStagingBytes);
}

TEST(MemoryPlan, DeviceRingFitsTheBudgetAndHostFallbackExcludesWhatStaysOnTheHost) {
  auto in = inputs({10 << 20, 200 << 20, 1 << 20});
  in.staged = true;
  in.copy = false;
  in.device_budget = 100 << 20;
  // The 200 MiB tensor is over the budget: an error naming it, before anything is allocated.
  EXPECT_NE(error_of(in).find("'t1'"), std::string::npos);
  EXPECT_NE(error_of(in).find("device memory budget"), std::string::npos);
  // With host fallback it stays on the host; the ring is sized for the others, within budget.
  in.host_fallback = true;
  auto plan = plan::plan_memory(in, name_of, "m.safetensors");
  EXPECT_LE(plan.device_ring_bytes, 100ull << 20);
  EXPECT_GE(plan.device_ring_bytes, 10ull << 20);
  EXPECT_LT(plan.max_group_bytes, 200ull << 20);  // the fallback tensor forms its own group
  // An explicit buffer over the budget is refused as such.
  in.buffer_size = 101 << 20;
  EXPECT_NE(error_of(in).find("exceeds the device memory budget"), std::string::npos);
  // Owned device tensors (copy): the read-ahead stays within the budget.
  in.copy = true;
  in.buffer_size = 0;
  in.device_budget = 5 << 20;
  EXPECT_EQ(plan::plan_memory(in, name_of, "m").buffer_size, 5ull << 20);
}

}  // namespace
}  // namespace instanttensor::loader

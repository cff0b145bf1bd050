// The staged transfer (host staging ring -> device stage), forced on for a CPU target so that
// ring wrap-around, slot reuse, ordering and materialization run without an accelerator.
#include <gtest/gtest.h>
#include <instanttensor/instanttensor.h>

#include "helper_files.h"
#include "helper_models.h"

namespace instanttensor {
namespace {

using testing::TempDir;

using testing::Model;

Model write_model(const TempDir& dir) {
  std::map<std::string, at::Tensor> a, b;
  a["embed"] = at::randn({96, 64}).to(at::kBFloat16);
  for (int i = 0; i < 30; ++i) {
    (i % 2 ? a : b)["layer." + std::to_string(i) + ".w"] = at::randn({16 + i, 24});
    (i % 2 ? a : b)["layer." + std::to_string(i) + ".b"] = at::randn({24}).to(at::kHalf);
  }
  b["empty"] = at::empty({0, 2});
  return testing::save_shards(dir, {{"a.safetensors", a}, {"b.safetensors", b}});
}

OpenOptions staged(bool copy, int64_t staging, int64_t buffer = 0) {
  OpenOptions options;
  options.force_staging = true;
  options.copy = copy;
  options.staging_size = staging;
  if (buffer) options.buffer_size = buffer;
  return options;
}

TEST(Staging, CopyAndBorrowThroughTheStageMatchTheFile) {
  TempDir dir;
  auto model = write_model(dir);
  for (bool copy : {true, false}) {
    SafeOpen f(model.files, staged(copy, 64 << 10));
    for (int pass = 0; pass < 2; ++pass) {
      size_t seen = 0;
      for (auto& [name, tensor] : f) {
        EXPECT_TRUE(at::equal(tensor, model.tensors.at(name))) << name;
        ++seen;
      }
      EXPECT_EQ(seen, model.tensors.size());
    }
    EXPECT_TRUE(at::equal(f.get_tensor("embed"), model.tensors.at("embed")));
    EXPECT_EQ(f.stats().materializations, 0u);  // a consumer that drops each tensor pays nothing
  }
}

TEST(Staging, RetainedBorrowedTensorsSurviveWrapsOfBothRings) {
  TempDir dir;
  auto model = write_model(dir);
  // Small staging and device rings: both wrap several times over one pass.
  const int64_t ring = static_cast<int64_t>(model.largest + 8192);
  const int64_t staging = 32 << 10;
  ASSERT_GT(model.total, 3u * std::max(ring, staging));
  SafeOpen f(model.files, staged(false, staging, ring));
  std::vector<std::pair<std::string, at::Tensor>> kept;
  std::vector<at::Tensor> views;
  for (auto& item : f) {
    kept.push_back(item);
    if (item.second.numel() > 0) views.push_back(item.second.view({-1}).narrow(0, 0, 1));
  }
  EXPECT_GT(f.stats().materializations, 0u);
  for (auto& [name, tensor] : kept) EXPECT_TRUE(at::equal(tensor, model.tensors.at(name))) << name;
  f.close();  // the device ring goes away; kept tensors were copied out first
  for (auto& [name, tensor] : kept) EXPECT_TRUE(at::equal(tensor, model.tensors.at(name))) << name;
  size_t v = 0;
  for (auto& [name, tensor] : kept) {
    if (tensor.numel() == 0) continue;
    EXPECT_EQ(views[v++].data_ptr(), tensor.data_ptr()) << name << ": the view followed";
  }
}

TEST(Staging, BudgetAndSizeErrorsNameTheTensorBeforeAllocating) {
  TempDir dir;
  auto model = write_model(dir);
  auto expect_error = [&](const OpenOptions& options, const std::string& needle) {
    try {
      SafeOpen f(model.files, options);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      std::string message = e.what();
      EXPECT_EQ(e.kind(), ErrorKind::Argument) << message;
      EXPECT_NE(message.find(needle), std::string::npos) << message;
    }
  };
  expect_error(staged(true, 1024), "staging_size=1024 bytes is below");
  OpenOptions budget = staged(true, 64 << 10);
  budget.device_budget = static_cast<int64_t>(model.largest / 2);
  expect_error(budget, "device memory budget");
  OpenOptions ring = staged(false, 64 << 10, 1 << 20);
  ring.device_budget = 1 << 19;
  expect_error(ring, "exceeds the device memory budget");

  budget.host_fallback = true;  // the oversized tensor stays on the host instead
  SafeOpen f(model.files, budget);
  for (auto& [name, tensor] : f) EXPECT_TRUE(at::equal(tensor, model.tensors.at(name))) << name;
}

TEST(Staging, TensorsLargerThanTheStagingRingStreamThroughItInSlices) {
  TempDir dir;
  std::map<std::string, at::Tensor> tensors;
  tensors["big"] = at::randn({1024, 256});  // 1 MiB, 32 x the staging ring
  tensors["small"] = at::randn({7, 3});
  tensors["bigger"] = at::randn({3, 1024, 128}).to(at::kBFloat16);
  auto model = testing::save_shards(dir, {{"m.safetensors", tensors}});
  for (bool copy : {true, false}) {
    SCOPED_TRACE(copy ? "copy" : "borrow");
    OpenOptions options = staged(copy, 32 << 10);
    SafeOpen f(model.files, options);
    for (int pass = 0; pass < 2; ++pass) {
      for (auto& [name, tensor] : f) {
        EXPECT_TRUE(at::equal(tensor, model.tensors.at(name))) << name;
      }
    }
    // Every read went through the small ring in slices of at most the stream chunk.
    EXPECT_GE(f.stats().read_requests, 2 * (model.total / (16 << 10)));
  }
}

TEST(Staging, HostFallbackWithBorrowingSizesTheDeviceRingForTheTensorsThatGoThere) {
  TempDir dir;
  auto model = write_model(dir);
  // The largest tensor exceeds the budget: it stays on the host, and the device ring is sized
  // (and checked) for the others, instead of refusing the buffer before fallback is considered.
  OpenOptions options = staged(false, 64 << 10);
  options.device_budget = static_cast<int64_t>(model.largest - 1);
  options.host_fallback = true;
  SafeOpen f(model.files, options);
  EXPECT_LE(f.buffer_size(), model.largest - 1);
  size_t seen = 0;
  for (auto& [name, tensor] : f) {
    EXPECT_TRUE(at::equal(tensor, model.tensors.at(name))) << name;
    ++seen;
  }
  EXPECT_EQ(seen, model.tensors.size());
}

TEST(Staging, DefaultDeviceBufferFitsTheBudgetItWasCheckedAgainst) {
  TempDir dir;
  auto model = write_model(dir);
  // A budget that fits the largest tensor but not the default two-tensors-plus-read-ahead
  // ring: the ring shrinks to the budget at open instead of failing at the first next().
  OpenOptions options = staged(false, 64 << 10);
  options.device_budget = static_cast<int64_t>(model.largest + 4096);
  SafeOpen f(model.files, options);
  EXPECT_LE(f.buffer_size(), model.largest + 4096);
  size_t seen = 0;
  for (auto& [name, tensor] : f) {
    EXPECT_TRUE(at::equal(tensor, model.tensors.at(name))) << name;
    ++seen;
  }
  EXPECT_EQ(seen, model.tensors.size());
}

}  // namespace
}  // namespace instanttensor

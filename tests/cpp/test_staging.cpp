// The staged transfer (host staging ring -> device stage), forced on for a CPU target so that
// ring wrap-around, slot reuse, ordering and materialization run without an accelerator.
#include <gtest/gtest.h>
#include <instanttensor/instanttensor.h>

#include "test_files.h"
#include "test_models.h"

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
    SafeOpen f(model.files, staged(copy, static_cast<int64_t>(model.largest + 16384)));
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
  ASSERT_GT(model.total, 4u * ring);
  SafeOpen f(model.files, staged(false, ring, ring));
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
  expect_error(staged(true, 1024), "'embed'");  // staging smaller than a tensor
  OpenOptions budget = staged(true, static_cast<int64_t>(model.largest + 16384));
  budget.device_budget = static_cast<int64_t>(model.largest / 2);
  expect_error(budget, "device memory budget");
  OpenOptions ring = staged(false, static_cast<int64_t>(model.largest + 16384), 1 << 20);
  ring.device_budget = 1 << 19;
  expect_error(ring, "exceeds the device memory budget");

  budget.host_fallback = true;  // the oversized tensor stays on the host instead
  SafeOpen f(model.files, budget);
  for (auto& [name, tensor] : f) EXPECT_TRUE(at::equal(tensor, model.tensors.at(name))) << name;
}

}  // namespace
}  // namespace instanttensor

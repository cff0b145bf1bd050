// The exchange's pure parts: how a unit reaches every rank.
#include <gtest/gtest.h>

#include "loader/exchange/rank_exchange.h"

namespace instanttensor::loader {
namespace {

using c10::DeviceType;

TEST(GatherMethod, AllGatherExceptWhereGlooDoesBetterWithBroadcasts) {
  const auto cpu = DeviceType::CPU, cuda = DeviceType::CUDA;
  EXPECT_EQ(choose_gather_method(plan::ExchangePlace::Device, "nccl", cuda),
            GatherMethod::AllGather);
  // The device ring on the CPU (tests): the all-gather NCCL takes on GPUs.
  EXPECT_EQ(choose_gather_method(plan::ExchangePlace::Device, "gloo", cpu),
            GatherMethod::AllGather);
  EXPECT_EQ(choose_gather_method(plan::ExchangePlace::Device, "gloo", cuda),
            GatherMethod::Broadcasts);
  EXPECT_EQ(choose_gather_method(plan::ExchangePlace::Host, "gloo", cpu), GatherMethod::Broadcasts);
  EXPECT_EQ(choose_gather_method(plan::ExchangePlace::Host, "mpi", cpu), GatherMethod::AllGather);
}

}  // namespace
}  // namespace instanttensor::loader

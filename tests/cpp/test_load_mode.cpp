// The load mode (plan/load_mode.h): every combination of target, options and process group,
// as a table, against what each part of the loader must then do.
#include <gtest/gtest.h>

#include "plan/load_mode.h"

namespace instanttensor::loader {
namespace {

struct Row {
  const char* what;
  plan::LoadModeInputs in;
  bool staged, ring, host_fallback, mapped_access, mapped_iteration;
  plan::ExchangePlace exchange;
  bool fell_back;
};

plan::LoadModeInputs inputs(bool accelerator, bool copy, bool distributed = false,
                            bool serves = false) {
  plan::LoadModeInputs in;
  in.accelerator_target = accelerator;
  in.copy = copy;
  in.distributed = distributed;
  in.group_serves_target = serves;
  return in;
}

plan::LoadModeInputs with(plan::LoadModeInputs in, bool force_staging, bool host_fallback,
                          bool mapping) {
  in.force_staging = force_staging;
  in.host_fallback = host_fallback;
  in.mapping_backend = mapping;
  return in;
}

plan::LoadModeInputs policy(plan::LoadModeInputs in, plan::ExchangePolicy exchange, int hosts = 1) {
  in.exchange_policy = exchange;
  in.hosts = hosts;
  return in;
}

const Row kRows[] = {
    // what                        inputs                                      st ring hf  ma   mi
    {"cpu copy", inputs(false, true), false, false, false, false, false, plan::ExchangePlace::Local,
     false},
    {"cpu borrow", inputs(false, false), false, true, false, false, false,
     plan::ExchangePlace::Local, false},
    {"cpu copy mmap", with(inputs(false, true), false, false, true), false, false, false, true,
     false, plan::ExchangePlace::Local, false},
    {"cpu borrow mmap", with(inputs(false, false), false, false, true), false, true, false, true,
     true, plan::ExchangePlace::Local, false},
    {"cpu host_fallback is moot", with(inputs(false, true), false, true, false), false, false,
     false, false, false, plan::ExchangePlace::Local, false},
    {"forced staging", with(inputs(false, true), true, false, false), true, false, false, false,
     false, plan::ExchangePlace::Local, false},
    {"forced staging mmap", with(inputs(false, false), true, false, true), true, true, false, false,
     false, plan::ExchangePlace::Local, false},
    {"accelerator copy", inputs(true, true), true, false, false, false, false,
     plan::ExchangePlace::Local, false},
    {"accelerator borrow", inputs(true, false), true, true, false, false, false,
     plan::ExchangePlace::Local, false},
    {"accelerator host fallback", with(inputs(true, true), false, true, false), true, false, true,
     false, false, plan::ExchangePlace::Local, false},
    {"accelerator mmap reads, no views", with(inputs(true, false), false, false, true), true, true,
     false, false, false, plan::ExchangePlace::Local, false},
    {"host exchange copy", policy(inputs(false, true, true, true), plan::ExchangePolicy::Always),
     false, true, false, false, false, plan::ExchangePlace::Host, false},
    {"host group copy reads alone", inputs(false, true, true, true), false, false, false, false,
     false, plan::ExchangePlace::Local, false},
    {"host group borrow mmap: mapped views",
     with(inputs(false, false, true, true), false, false, true), false, true, false, true, true,
     plan::ExchangePlace::Local, false},
    {"host exchange mmap: no mapped iteration",
     policy(with(inputs(false, false, true, true), false, false, true),
            plan::ExchangePolicy::Always),
     false, true, false, true, false, plan::ExchangePlace::Host, false},
    {"device exchange", inputs(true, true, true, true), true, true, false, false, false,
     plan::ExchangePlace::Device, false},
    {"forced staging exchange", with(inputs(false, true, true, true), true, false, false), true,
     true, false, false, false, plan::ExchangePlace::Device, false},
    {"group without the target's backend", inputs(true, true, true, false), true, false, false,
     false, false, plan::ExchangePlace::Local, true},
    {"cpu group without gloo, borrow mmap",
     with(inputs(false, false, true, false), false, false, true), false, true, false, true, true,
     plan::ExchangePlace::Local, true},
};

TEST(LoadMode, EveryCombinationOfTargetOptionsAndGroup) {
  for (const Row& row : kRows) {
    SCOPED_TRACE(row.what);
    plan::LoadMode mode = plan::choose_load_mode(row.in);
    EXPECT_EQ(mode.accelerator, row.in.accelerator_target);
    EXPECT_EQ(mode.staged, row.staged);
    EXPECT_EQ(mode.ring, row.ring);
    EXPECT_EQ(mode.host_fallback, row.host_fallback);
    EXPECT_EQ(mode.mapped_access, row.mapped_access);
    EXPECT_EQ(mode.mapped_iteration, row.mapped_iteration);
    EXPECT_EQ(mode.exchange, row.exchange);
    EXPECT_EQ(mode.exchange_fell_back, row.fell_back);
    EXPECT_EQ(mode.exchanging(), row.exchange != plan::ExchangePlace::Local);
  }
}

// The exchange by cost: which group exchanges, where, and why (what stats() says).
struct ExchangeRow {
  const char* what;
  plan::LoadModeInputs in;
  plan::ExchangePlace exchange;
  bool in_step;
  const char* described;
};

const ExchangeRow kExchangeRows[] = {
    {"single process", inputs(false, true), plan::ExchangePlace::Local, false,
     "none (single process)"},
    {"no backend for the target", inputs(true, true, true, false), plan::ExchangePlace::Local,
     false, "none (the group has no backend for the target)"},
    {"host target, one host", inputs(false, true, true, true), plan::ExchangePlace::Local, true,
     "none (one host, host target)"},
    {"host target borrow, one host", inputs(false, false, true, true), plan::ExchangePlace::Local,
     true, "none (one host, host target)"},
    {"host target, two hosts",
     policy(inputs(false, true, true, true), plan::ExchangePolicy::Auto, 2),
     plan::ExchangePlace::Local, true,
     "none (several hosts, host target: each rank reads everything)"},
    {"host target, always", policy(inputs(false, false, true, true), plan::ExchangePolicy::Always),
     plan::ExchangePlace::Host, true, "host (exchange=always)"},
    {"device target", inputs(true, true, true, true), plan::ExchangePlace::Device, true,
     "device (device target)"},
    {"device target, two hosts",
     policy(inputs(true, false, true, true), plan::ExchangePolicy::Auto, 2),
     plan::ExchangePlace::Device, true, "device (device target)"},
    {"device target, never", policy(inputs(true, true, true, true), plan::ExchangePolicy::Never),
     plan::ExchangePlace::Local, true, "none (exchange=never)"},
    {"forced staging, auto", with(inputs(false, true, true, true), true, false, false),
     plan::ExchangePlace::Device, true, "device (device target)"},
    {"host target, never", policy(inputs(false, true, true, true), plan::ExchangePolicy::Never),
     plan::ExchangePlace::Local, true, "none (exchange=never)"},
    {"no backend, always: nothing to exchange with",
     policy(inputs(false, true, true, false), plan::ExchangePolicy::Always),
     plan::ExchangePlace::Local, false, "none (the group has no backend for the target)"},
};

TEST(LoadMode, TheExchangeIsChosenByCost) {
  for (const ExchangeRow& row : kExchangeRows) {
    SCOPED_TRACE(row.what);
    plan::LoadMode mode = plan::choose_load_mode(row.in);
    EXPECT_EQ(mode.exchange, row.exchange);
    EXPECT_EQ(mode.in_step, row.in_step);
    EXPECT_EQ(plan::describe_exchange(mode), row.described);
    // The walk the open composes for it.
    EXPECT_EQ(mode.walk_kind(), !row.in_step ? plan::WalkKind::Alone
                                : row.exchange != plan::ExchangePlace::Local
                                    ? plan::WalkKind::Exchanging
                                    : plan::WalkKind::InStep);
    if (mode.walk_kind() == plan::WalkKind::Exchanging) {  // only the read pass exchanges
      EXPECT_EQ(mode.pass_kind(), plan::PassKind::Read);
    }
  }
}

TEST(LoadMode, AGroupReadingAloneReadsLikeOneProcess) {
  // No shares, no ring for copy=True: each rank's reads land in its tensors, as alone.
  plan::LoadMode alone = plan::choose_load_mode(inputs(false, true));
  plan::LoadMode group = plan::choose_load_mode(inputs(false, true, true, true));
  EXPECT_EQ(group.destination_of(5000, 1000), alone.destination_of(5000, 1000));
  EXPECT_FALSE(group.uses_shares(plan::Destination::HostOwned));
  EXPECT_FALSE(group.uses_shares(plan::Destination::HostRing));
}

TEST(LoadMode, DestinationsAndSharesFollowTheMode) {
  const uint64_t budget = 1000;
  plan::LoadMode cpu_copy = plan::choose_load_mode(inputs(false, true));
  EXPECT_EQ(cpu_copy.destination_of(5000, budget), plan::Destination::HostOwned);
  EXPECT_FALSE(cpu_copy.uses_shares(plan::Destination::HostOwned));
  plan::LoadMode cpu_borrow = plan::choose_load_mode(inputs(false, false));
  EXPECT_EQ(cpu_borrow.destination_of(5, budget), plan::Destination::HostRing);
  EXPECT_FALSE(cpu_borrow.uses_shares(plan::Destination::HostRing));  // one read per group
  plan::LoadMode host_exchange =
      plan::choose_load_mode(policy(inputs(false, true, true, true), plan::ExchangePolicy::Always));
  EXPECT_EQ(host_exchange.destination_of(5, budget), plan::Destination::HostRing);
  EXPECT_TRUE(host_exchange.uses_shares(plan::Destination::HostRing));  // rank shares, in place
  plan::LoadMode device_copy = plan::choose_load_mode(inputs(true, true));
  EXPECT_EQ(device_copy.destination_of(5000, budget), plan::Destination::DeviceOwned);
  EXPECT_TRUE(device_copy.uses_shares(plan::Destination::DeviceOwned));  // through the staging ring
  plan::LoadMode device_borrow = plan::choose_load_mode(inputs(true, false));
  EXPECT_EQ(device_borrow.destination_of(5, budget), plan::Destination::DeviceRing);
  plan::LoadMode fallback = plan::choose_load_mode(with(inputs(true, true), false, true, false));
  EXPECT_EQ(fallback.destination_of(budget, budget), plan::Destination::DeviceOwned);
  EXPECT_EQ(fallback.destination_of(budget + 1, budget), plan::Destination::HostOwned);
  EXPECT_FALSE(fallback.uses_shares(plan::Destination::HostOwned));  // read whole, on the host
  EXPECT_TRUE(fallback.moves_to_target(budget, budget));
  EXPECT_FALSE(fallback.moves_to_target(budget + 1, budget));
  EXPECT_FALSE(cpu_copy.moves_to_target(5, budget));
  plan::LoadMode forced = plan::choose_load_mode(with(inputs(false, true), true, true, false));
  EXPECT_FALSE(forced.moves_to_target(5, budget));  // a CPU target has nowhere to move to
}

// Host views (a backend chain starting with auto or mmap): wherever a host target reads alone,
// copy=true or false, but never where bytes go through the stage or an exchange; the explicit
// mmap+borrow contract keeps its views for life.
TEST(LoadMode, HostViewsWhereAHostTargetReadsAlone) {
  struct ViewsRow {
    const char* what;
    plan::LoadModeInputs in;
    bool host_views;
  };
  auto views = [](plan::LoadModeInputs in) {
    in.page_cache_views = true;
    return in;
  };
  const ViewsRow rows[] = {
      {"cpu copy", views(inputs(false, true)), true},
      {"cpu borrow: views too", views(inputs(false, false)), true},
      {"cpu borrow in a group reading alone", views(inputs(false, false, true, true)), true},
      {"cpu copy mmap", views(with(inputs(false, true), false, false, true)), true},
      {"cpu borrow mmap: views for life instead",
       views(with(inputs(false, false), false, false, true)), false},
      {"a chain that names a read backend", inputs(false, true), false},
      {"forced staging", views(with(inputs(false, true), true, false, false)), false},
      {"accelerator", views(inputs(true, true)), false},
      {"host group reading alone", views(inputs(false, true, true, true)), true},
      {"host group without gloo", views(inputs(false, true, true, false)), true},
      {"host exchange",
       views(policy(inputs(false, true, true, true), plan::ExchangePolicy::Always)), false},
  };
  for (const auto& row : rows) {
    SCOPED_TRACE(row.what);
    plan::LoadMode mode = plan::choose_load_mode(row.in);
    EXPECT_EQ(mode.host_views, row.host_views);
    EXPECT_EQ(mode.pass_kind(), mode.mapped_iteration ? plan::PassKind::Mapped
                                : row.host_views      ? plan::PassKind::PageCacheViews
                                                      : plan::PassKind::Read);
    if (mode.host_views) {  // a fallback to the read path places as the mode says
      EXPECT_EQ(mode.destination_of(1, UINT64_MAX),
                mode.ring ? plan::Destination::HostRing : plan::Destination::HostOwned);
    }
  }
}

}  // namespace
}  // namespace instanttensor::loader

#include "loader/pass/read_pass.h"

#include <c10/core/DeviceGuard.h>
#include <c10/util/ScopeExit.h>

#include "loader/exchange/exchange_protocol.h"
#include "loader/pass/share_feed.h"
#include "loader/reads/read_tags.h"
#include "loader/reads/timing.h"

namespace instanttensor::loader {

ReadPass::ReadPass(const PassPlan& plan, ReadScheduler& reads, TensorMemory& memory,
                   c10::Device target, bool copy, int rank, Stats& stats)
    : Pass(plan), reads_(reads), memory_(memory), target_(target), copy_(copy), stats_(stats) {
  const uint64_t bound = plan.memory.buffer_size;
  const uint64_t padding = plan.mode.exchanging() ? plan.memory.layout.padding() : 0;
  if (DeviceStage* stage = memory.stage()) {
    staging_ = std::make_unique<StagingStream>(*stage, reads, plan.memory.staging_slice);
    device_owned_ = std::make_unique<OwnedPlacement>(plan, memory.recycled(), stage, bound, stats);
    device_ring_placement_ =
        std::make_unique<RingPlacement>(plan, stage->device_ring(), padding, stats);
  }
  host_owned_ = std::make_unique<OwnedPlacement>(plan, memory.recycled(), nullptr, bound, stats);
  // Each feed serves the groups its kind of read suits (mode.uses_shares), and skips the others.
  feeds_.push_back(std::make_unique<WholeGroupFeed>(plan, plan.mode, reads));
  feeds_.push_back(
      std::make_unique<ShareFeed>(plan, plan.mode, reads, staging_.get(), rank, stats));
}

ReadPass::~ReadPass() = default;

void ReadPass::drain() noexcept {
  // Reads of an abandoned pass still target its memory: finish them before anything is reused.
  reads_.drain();
  for (auto& feed : feeds_) feed->reset();
  keep_owned_until_copied();
}

void ReadPass::keep_owned_until_copied() noexcept {
  DeviceStage* stage = memory_.stage();
  if (!stage) return;
  bool dropped = false;
  for (auto& item : state_.items) {
    if (item.owned) dropped |= stage->record_use_by_copies(*item.owned);
  }
  if (dropped) stage->order_consumer_after_copies();
}

Placement& ReadPass::placement_for(plan::Destination where) {
  switch (where) {
    case plan::Destination::HostOwned:
      return *host_owned_;
    case plan::Destination::DeviceOwned:
      return *device_owned_;
    case plan::Destination::DeviceRing:
      return *device_ring_placement_;
    case plan::Destination::HostRing:
      break;
  }
  if (!host_ring_placement_) {
    host_streams_ = std::make_unique<LoaderStreams>(c10::Device(c10::DeviceType::CPU));
    host_ring_ = std::make_unique<BorrowRing>(*host_streams_, BorrowRing::Memory::Host,
                                              plan_.memory.host_ring_bytes, plan_.ring_alignment,
                                              "the borrow buffer");
    host_ring_placement_ = std::make_unique<RingPlacement>(
        plan_, *host_ring_, plan_.mode.exchanging() ? plan_.memory.layout.padding() : 0, stats_);
  }
  return *host_ring_placement_;
}

bool ReadPass::place_group(size_t g, bool force) {
  const plan::ReadGroup& group = plan_.reads.groups[g];
  GroupState& state = state_.groups[g];
  state.where = plan_.destination_of(g);
  state.range = plan::align_range(group.file_offset, group.length, plan_.io_alignment);
  if (group.length == 0) {  // only empty tensors: nothing to place or read, on any rank
    state.placed = state.landed = true;
    return true;
  }
  return placement_for(state.where).place(g, state_, force);
}

void ReadPass::pump() {
  while (state_.next_group < plan_.reads.groups.size()) {
    if (!place_group(state_.next_group, /*force=*/false)) break;
    state_.next_group++;
    // Each group's read starts before the next one is placed, so the disk is busy while the
    // loader allocates. Placing every group first measured 0.84-0.85x the earlier code cold
    // with copy=True in interleaved runs (benchmarks/ab_installs.py); this order, 0.96-1.09x.
    // The share feed's reads start right after their group's placement too.
    submit_placed();
  }
  submit_placed();
}

void ReadPass::submit_placed() {
  for (auto& feed : feeds_) feed->submit_placed(state_);
}

void ReadPass::land(std::optional<size_t> waited) {
  for (auto& feed : feeds_) {
    if (auto failure = feed->land(state_, waited)) fail(std::move(*failure));
  }
}

void ReadPass::check_reads() {
  auto failed = reads_.first_failed_tag();
  if (!failed || !read_tags::of_the_pass(*failed)) return;
  std::optional<size_t> group;
  for (auto& feed : feeds_) {
    if (!group) group = feed->group_of(*failed);
  }
  if (!group) {  // a failed read of the pass that no feed is waiting for: never guessed
    throw Error(ErrorKind::Internal, plan_.first_path(), "",
                "a read of the pass failed that no group is waiting for");
  }
  const auto& first = plan_.first_tensor(*group);
  fail(read_failure_error(*reads_.failure(*failed), plan_.file_of(first), first.name()));
}

void ReadPass::wait_until_landed(size_t g, size_t units) {
  auto start = Clock::now();
  TimelineSpan waited(reads_.timeline(), PassTimeline::Kind::ConsumerWait);
  GroupState& state = state_.groups[g];
  auto enough = [&] { return state.landed || (units != SIZE_MAX && state.units_landed >= units); };
  while (true) {
    land(g);
    if (enough()) break;
    pump();  // staging space freed by copies lets more shares in
    land(g);
    if (enough()) break;
    if (reads_.in_flight() == 0) {
      // Every read landed and its copy is queued; the staging ring is full of slices whose
      // copies still run: wait for the oldest, then submit into it.
      if (staging_ && staging_->wait_oldest_copy()) continue;
      throw Error(ErrorKind::Internal, plan_.file_of(plan_.first_tensor(g)),
                  plan_.first_tensor(g).name(), "waiting for a read that was never submitted");
    }
    // A worker idle for want of staging room gets it back first: the copy queued earliest
    // ends before any read that is not done yet would on a read-bound pass.
    if (staging_ && staging_->idle_reader_waits_for_room() && staging_->wait_oldest_copy()) {
      continue;
    }
    reads_.wait_one();
    check_reads();
  }
  stats_.wait_seconds += seconds_since(start);
  if (!state.verified) {
    // Re-stat after the reads: a writer updates the mtime before its bytes reach the page cache,
    // so bytes written in place since open are caught here, before any tensor of them goes out.
    const auto& first = plan_.first_tensor(g);
    try {
      plan_.checkpoint->check_unchanged(first.file_index, first.name());
    } catch (const Error& e) {
      fail(e);
    }
    state.verified = state.landed;
  }
}

void ReadPass::keep_reading_until(const std::function<bool()>& arrived) {
  while (!arrived()) {
    land(std::nullopt);
    pump();
    if (arrived()) return;
    if (reads_.in_flight() == 0 ||
        (staging_ && staging_->idle_reader_waits_for_room())) {  // as in wait_until_landed
      if (staging_ && staging_->wait_oldest_copy()) continue;
      if (reads_.in_flight() == 0) return;
    }
    reads_.wait_one();
  }
}

void ReadPass::make_ready(size_t item, bool wait) {
  size_t g = plan_.reads.group_of[item];
  pump();
  if (!state_.groups[g].placed) {
    // Nothing is ahead and the ring only holds handed-out tensors: make room even if that means
    // copying out the live one.
    if (!place_group(g, /*force=*/true)) {
      const auto& t = plan_.tensor_of_item(item);
      throw Error(ErrorKind::Internal, plan_.file_of(t), t.name(), "no room in the borrow buffer");
    }
    state_.next_group++;
    submit_placed();  // its read starts before anything else is placed
    pump();
  }
  if (wait) wait_until_landed(g);
}

void ReadPass::release_consumed() {
  if (device_ring_placement_) device_ring_placement_->release_consumed(state_);
}

void ReadPass::prepare(size_t item) {
  try {
    release_consumed();
    make_ready(item, /*wait=*/true);
    pump();
  } catch (const Error& e) {
    // A submit that threw (a descriptor or the read workers could not be had) fails the pass
    // as a failed read does: a retried step must not go on from half-submitted slices.
    if (!state().error) fail(e);
    throw;
  }
}

std::optional<Error> ReadPass::settle(size_t item) {
  if (item >= plan_.reads.items.size()) return std::nullopt;
  try {
    prepare(item);
  } catch (const Error& e) {
    return e;
  } catch (const std::exception& e) {  // else the other ranks would wait in their round
    return failure_of(e, item);
  }
  return std::nullopt;
}

const c10::Stream* ReadPass::loader_stream() const {
  DeviceStage* stage = memory_.stage();
  return stage ? &stage->streams().loader() : nullptr;
}

std::pair<std::string, at::Tensor> ReadPass::hand_out(size_t item, ExchangeProtocol* gathers) {
  const auto& t = plan_.tensor_of_item(item);
  if (item > 0) {
    // The consumer moves past a file: its reads have landed and been checked (storage order
    // keeps a file's items together).
    const size_t behind = plan_.tensor_of_item(item - 1).file_index;
    if (behind != t.file_index) reads_.release_if_idle(behind);
  }
  ItemState& state = state_.items[item];
  GroupState& group = state_.groups[plan_.reads.group_of[item]];
  state_.next_item = item + 1;
  // Take the owned storage before anything can throw, so a tensor torch cannot represent
  // (F6) is skipped cleanly and the read-ahead budget stays right.
  auto owned = std::move(state.owned);
  if (owned) state_.ahead_bytes -= t.nbytes;
  // Dropped by a throw before it becomes the tensor: its copy may still be queued.
  auto drop_after_copies = c10::make_scope_exit([&] {
    if (owned && memory_.stage()) memory_.stage()->keep_until_copied(*owned);
  });
  TensorFactory& factory = memory_.factory();
  auto spec = factory.spec(t);
  stats_.tensors_loaded += 1;
  const bool on_device =
      group.where == plan::Destination::DeviceOwned || group.where == plan::Destination::DeviceRing;
  const c10::Device device = on_device ? target_ : c10::Device(c10::DeviceType::CPU);
  c10::DeviceGuard guard(device);
  if (t.nbytes == 0) {
    // An empty tensor: nothing read, nothing exchanged; it lives where its group would.
    return {t.name(), factory.empty(t, device)};
  }
  if (gathers) {
    auto start = Clock::now();
    gathers->wait_gathers();  // the consumer's stream (or the host) waits for the bytes
    stats_.exchange_seconds += seconds_since(start);
  } else if (on_device) {
    group.landed_fence.block(memory_.stage()->streams().consumer(), "landed");
  }
  if (owned) return {t.name(), factory.aligned(TensorFactory::over(std::move(owned), spec), t)};
  at::Tensor tensor =
      TensorFactory::over(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(state.borrowed), spec);
  // copy=true through a ring (the exchange): the consumer gets its own bytes.
  if (copy_) return {t.name(), factory.owned_copy(tensor, t)};
  return {t.name(), factory.aligned(tensor, t)};
}

void ReadPass::leave_parent_work_behind() {
  for (auto& feed : feeds_) feed->reset();
}

void ReadPass::replace_pool(const std::shared_ptr<pool::RecycledBlocks>& recycled) {
  host_owned_->replace_pool(recycled);
  if (device_owned_) device_owned_->replace_pool(recycled);
}

uint64_t ReadPass::release_memory() {
  // Retained borrowed tensors must outlive the ring: copied out now.
  uint64_t materialized = host_ring_ ? host_ring_->release_all() : 0;
  host_ring_placement_.reset();
  host_ring_.reset();
  return materialized;
}

}  // namespace instanttensor::loader

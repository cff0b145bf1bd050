// The pass over the read plan: placing and submitting groups ahead of the consumer, landing
// them and handing their tensors out in storage order (the steps of ranks in step:
// loader_in_step.cpp).
#include <c10/core/DeviceGuard.h>
#include <c10/util/ScopeExit.h>

#include "loader/loader.h"
#include "loader/loader_parts.h"
#include "loader/reads/read_tags.h"
#include "loader/reads/timing.h"
#include "loader/transfer/storage_views.h"

namespace instanttensor {

using loader::Clock;
using loader::seconds_since;

using loader::Destination;
namespace read_tags = loader::read_tags;

void Loader::drain_in_flight() noexcept {
  // Reads of an abandoned pass still target its memory: finish them before anything is reused.
  reads_->drain();
  for (auto& feed : feeds_) feed->reset();
  keep_owned_until_copied();
}

void Loader::keep_owned_until_copied() noexcept {
  bool dropped = false;
  for (auto& item : pass_.items) {
    if (item.owned) dropped |= record_use_by_copies(*item.owned);
  }
  if (dropped) order_consumer_after_copies();
}

void Loader::keep_until_copied(c10::StorageImpl& owned) noexcept {
  if (record_use_by_copies(owned)) order_consumer_after_copies();
}

// Owned device memory dropped before it was handed out may still be the target of a copy queued
// on the loader's stream (a staged read's, a gather's). It was allocated on the consumer's
// stream, whose free does not wait for that copy: on CUDA the caching allocator would hand the
// block to the next allocation while the copy still writes into it. Both steps below order the
// free after the copies: the allocator's record of a use on the loader's stream (torch's
// record_stream; a no-op for allocators without one, or memory they do not own), and the
// consumer's stream made to wait for the loader's, with no host wait.
bool Loader::record_use_by_copies(c10::StorageImpl& owned) noexcept {
  if (!stage_ || owned.device().is_cpu() || loader::fence_dropped("owned_free")) return false;
  try {
    stage_->streams().record_on_loader(owned.data_ptr());
  } catch (...) {
    // Not recorded: the consumer's stream waiting for the loader's orders the free still.
  }
  return true;
}

void Loader::order_consumer_after_copies() noexcept {
  try {
    loader::CopyFence::after(stage_->streams().loader())
        .block(stage_->streams().consumer(), "owned_free");
  } catch (...) {
    // A device in error: nothing queued on it will run.
  }
}

void Loader::begin_pass() {
  drain_in_flight();
  if (exchange_) {
    exchange_->wait_gathers();
    exchange_->forget_deferred();
  }
  pass_.begin(plan_.reads);
  if (views_) views_->begin_pass();
  try {
    plan_.checkpoint->check_unchanged();
  } catch (const Error& e) {
    pass_.error.emplace(e);  // the pass is over before it began; next() keeps saying why
    throw;
  }
}

void Loader::restart() {
  auto lock = mutex_.lock();
  ensure_open();
  refuse_in_child(kIterationInChild, /*iteration=*/true);
  if (exchange_) {
    // Distributed: the pass begins inside the first next(), where a failure (a changed file)
    // travels with the first status round instead of raising on this rank alone.
    drain_in_flight();
    pass_.started = false;
    pass_.error.reset();
    return;
  }
  begin_pass();
}

loader::Placement& Loader::placement_for(Destination where) {
  switch (where) {
    case Destination::HostOwned:
      return *host_owned_;
    case Destination::DeviceOwned:
      return *device_owned_;
    case Destination::DeviceRing:
      return *device_ring_placement_;
    case Destination::HostRing:
      break;
  }
  if (!host_ring_placement_) {
    host_streams_ = std::make_unique<loader::LoaderStreams>(c10::Device(c10::DeviceType::CPU));
    host_ring_ = std::make_unique<loader::BorrowRing>(
        *host_streams_, loader::BorrowRing::Memory::Host, plan_.memory.host_ring_bytes,
        plan_.ring_alignment, "the borrow buffer");
    host_ring_placement_ = std::make_unique<loader::RingPlacement>(
        plan_, *host_ring_, mode_.exchanging() ? plan_.memory.layout.padding() : 0, stats_);
  }
  return *host_ring_placement_;
}

bool Loader::place_group(size_t g, bool force) {
  const plan::ReadGroup& group = plan_.reads.groups[g];
  loader::GroupState& state = pass_.groups[g];
  state.where = mode_.destination_of(plan_.first_tensor(g).nbytes, device_budget_);
  state.range = plan::align_range(group.file_offset, group.length, plan_.io_alignment);
  if (group.length == 0) {  // only empty tensors: nothing to place or read, on any rank
    state.placed = state.landed = true;
    return true;
  }
  return placement_for(state.where).place(g, pass_, force);
}

void Loader::pump() {
  while (pass_.next_group < plan_.reads.groups.size()) {
    if (!place_group(pass_.next_group, /*force=*/false)) break;
    pass_.next_group++;
    // Each group's read starts before the next one is placed, so the disk is busy while the
    // loader allocates. Placing every group first measured 0.84-0.85x the earlier code cold
    // with copy=True in interleaved runs (benchmarks/ab_installs.py); this order, 0.96-1.09x.
    // The share feed's reads start right after their group's placement too.
    submit_placed();
  }
  submit_placed();
}

void Loader::submit_placed() {
  for (auto& feed : feeds_) feed->submit_placed(pass_);
}

void Loader::land(size_t waited) {
  for (auto& feed : feeds_) {
    if (auto failure = feed->land(pass_, waited)) fail_pass(std::move(*failure));
  }
}

void Loader::fail_pass(Error error) {
  drain_in_flight();
  pass_.error.emplace(std::move(error));
  throw *pass_.error;
}

void Loader::check_pass_reads() {
  auto failed = reads_->first_failed_tag();
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
  fail_pass(read_failure_error(*reads_->failure(*failed), plan_.file_of(first), first.name()));
}

void Loader::wait_until_landed(size_t g, size_t units) {
  auto start = Clock::now();
  loader::GroupState& state = pass_.groups[g];
  auto enough = [&] { return state.landed || (units != SIZE_MAX && state.units_landed >= units); };
  while (true) {
    land(g);
    if (enough()) break;
    pump();  // staging space freed by copies lets more shares in
    land(g);
    if (enough()) break;
    if (reads_->in_flight() == 0) {
      // Every read landed and its copy is queued; the staging ring is full of slices whose
      // copies still run: wait for the oldest, then submit into it.
      if (staging_ && staging_->wait_oldest_copy()) continue;
      throw Error(ErrorKind::Internal, plan_.file_of(plan_.first_tensor(g)),
                  plan_.first_tensor(g).name(), "waiting for a read that was never submitted");
    }
    reads_->wait_one();
    check_pass_reads();
  }
  stats_.wait_seconds += seconds_since(start);
  if (!state.verified) {
    // Re-stat after the reads: a writer updates the mtime before its bytes reach the page cache,
    // so bytes written in place since open are caught here, before any tensor of them goes out.
    const auto& first = plan_.first_tensor(g);
    try {
      plan_.checkpoint->check_unchanged(first.file_index, first.name());
    } catch (const Error& e) {
      fail_pass(e);
    }
    state.verified = state.landed;
  }
}

void Loader::make_ready(size_t item, bool wait) {
  size_t g = plan_.reads.group_of[item];
  pump();
  if (!pass_.groups[g].placed) {
    // Nothing is ahead and the ring only holds handed-out tensors: make room even if that means
    // copying out the live one.
    if (!place_group(g, /*force=*/true)) {
      const auto& t = plan_.tensor_of_item(item);
      throw Error(ErrorKind::Internal, plan_.file_of(t), t.name(), "no room in the borrow buffer");
    }
    pass_.next_group++;
    submit_placed();  // its read starts before anything else is placed
    pump();
  }
  if (wait) wait_until_landed(g);
}

std::pair<std::string, at::Tensor> Loader::hand_out(size_t item) {
  const auto& t = plan_.tensor_of_item(item);
  loader::ItemState& state = pass_.items[item];
  loader::GroupState& group = pass_.groups[plan_.reads.group_of[item]];
  pass_.next_item = item + 1;
  // Take the owned storage before anything can throw, so a tensor torch cannot represent
  // (F6) is skipped cleanly and the read-ahead budget stays right.
  auto owned = std::move(state.owned);
  if (owned) pass_.ahead_bytes -= t.nbytes;
  // Dropped by a throw before it becomes the tensor: its copy may still be queued.
  auto drop_after_copies = c10::make_scope_exit([&] {
    if (owned) keep_until_copied(*owned);
  });
  auto spec = factory_->spec(t);
  stats_.tensors_loaded += 1;
  const bool on_device =
      group.where == Destination::DeviceOwned || group.where == Destination::DeviceRing;
  const c10::Device device = on_device ? options_.device : c10::Device(c10::DeviceType::CPU);
  c10::DeviceGuard guard(device);
  if (t.nbytes == 0) {
    // An empty tensor: nothing read, nothing exchanged; it lives where its group would.
    return {t.name(), factory_->empty(t, device)};
  }
  if (mode_.exchanging()) {
    auto start = Clock::now();
    exchange_->wait_gathers();  // the consumer's stream (or the host) waits for the bytes
    stats_.exchange_seconds += seconds_since(start);
  } else if (on_device) {
    group.landed_fence.block(stage_->streams().consumer(), "landed");
  }
  if (owned)
    return {t.name(), factory_->aligned(loader::TensorFactory::over(std::move(owned), spec))};
  at::Tensor tensor = loader::TensorFactory::over(
      c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(state.borrowed), spec);
  // copy=true through a ring (the exchange): the consumer gets its own bytes.
  if (options_.copy) return {t.name(), factory_->owned_copy(tensor)};
  return {t.name(), factory_->aligned(tensor)};
}

std::pair<std::string, at::Tensor> Loader::hand_out_mapped(size_t item) {
  pass_.next_item = item + 1;
  const auto& t = plan_.tensor_of_item(item);
  auto spec = factory_->spec(t);
  stats_.tensors_loaded += 1;
  auto storage = factory_->mapped(io_->mapping(), t, 0, t.nbytes);
  return {t.name(), factory_->aligned(loader::TensorFactory::over(std::move(storage), spec))};
}

std::pair<std::string, at::Tensor> Loader::hand_out_view(size_t item) {
  pass_.next_item = item + 1;
  const auto& t = plan_.tensor_of_item(item);
  stats_.tensors_loaded += 1;
  if (t.nbytes == 0) return {t.name(), factory_->empty(t, c10::Device(c10::DeviceType::CPU))};
  try {
    return {t.name(), views_->hand_out(item)};
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::Io) throw;  // a dtype torch lacks: that tensor alone is skipped
    fail_pass(e);
  }
}

Error Loader::failure_of(const std::exception& e, size_t item) const {
  const auto& t = plan_.tensor_of_item(item);
  return Error(ErrorKind::Io, plan_.file_of(t), t.name(), e.what());
}

std::optional<std::pair<std::string, at::Tensor>> Loader::next() {
  auto lock = mutex_.lock();
  ensure_open();
  refuse_in_child(kIterationInChild, /*iteration=*/true);
  if (mode_.exchanging()) return next_exchanged();
  return mode_.in_step ? next_in_step() : next_local();
}

std::optional<std::pair<std::string, at::Tensor>> Loader::next_local() {
  if (!pass_.started) begin_pass();
  if (pass_.error) throw *pass_.error;
  if (pass_.next_item >= plan_.reads.items.size()) {
    if (views_) views_->pass_ended();
    return std::nullopt;
  }
  size_t item = pass_.next_item;
  if (mode_.mapped_iteration) return hand_out_mapped(item);
  if (mode_.host_views) return hand_out_view(item);
  if (device_ring_placement_) device_ring_placement_->release_consumed(pass_);
  make_ready(item, /*wait=*/true);
  pump();
  return hand_out(item);
}

}  // namespace instanttensor

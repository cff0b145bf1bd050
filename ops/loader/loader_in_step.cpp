// The steps of ranks that walk the pass in step: exchanging each group with the other ranks
// (status rounds and gathers), or reading alone and meeting at StepRounds' items. Every rank
// makes the same collectives in the same order, whatever fails where.
#include "loader/loader.h"
#include "loader/loader_parts.h"

namespace instanttensor {

std::optional<Error> Loader::landing_failure(size_t g, size_t units) {
  try {
    wait_until_landed(g, units);
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

void Loader::exchange_group(size_t g, std::optional<Error> failure) {
  loader::GroupState& state = pass_.groups[g];
  const plan::ReadGroup& group = plan_.reads.groups[g];
  const std::string& file = plan_.file_of(plan_.first_tensor(g));
  auto deferred = exchange_->take_deferred();
  if (!failure) failure = std::move(deferred);
  // From the plan, not from state.where: a rank that failed before placing the group must
  // still make the same collectives as the others.
  const bool shares =
      mode_.uses_shares(mode_.destination_of(plan_.first_tensor(g).nbytes, device_budget_));
  const size_t units = plan_.unit_count(g);
  if (!shares || units == 0) {
    // Read whole by every rank (a tensor that stays on the host) or only empty tensors: a
    // status round alone, so a failure still reaches every rank.
    if (!failure) failure = landing_failure(g, SIZE_MAX);
    exchange_->status_round(failure, file, stats_);
    state.units_exchanged = 1;
    return;
  }
  const c10::Stream* loader_stream = stage_ ? &stage_->streams().loader() : nullptr;
  uint64_t own = 0;
  while (state.units_exchanged < units) {
    const size_t u = state.units_exchanged;
    if (!failure) failure = landing_failure(g, u + 1);  // this rank's share of unit u in place
    exchange_->status_round(failure, file, stats_);     // throws on every rank after a failure
    own += exchange_->gather_unit(g, u, plan_, state, loader_stream);
    state.units_exchanged += 1;
  }
  stats_.bytes_received += group.length - own;
}

std::optional<std::pair<std::string, at::Tensor>> Loader::next_exchanged() {
  // Every rank walks the same items and the same status rounds, so a failure here (a changed
  // file, a read error, no memory) travels with the next round and raises on every rank
  // together.
  if (pass_.error) throw *pass_.error;
  if (pass_.started && pass_.next_item >= plan_.reads.items.size()) return std::nullopt;
  size_t item = pass_.started ? pass_.next_item : 0;
  if (item >= plan_.reads.items.size()) {
    begin_pass();
    return std::nullopt;
  }
  std::optional<Error> failure;
  try {
    if (!pass_.started) begin_pass();
    if (device_ring_placement_) device_ring_placement_->release_consumed(pass_);
    make_ready(item, /*wait=*/false);
  } catch (const Error& e) {
    failure = e;
  } catch (const std::exception& e) {  // it travels with the round too
    failure = failure_of(e, item);
  }
  size_t g = plan_.reads.group_of[item];
  if (pass_.groups.empty()) {
    if (failure) throw *failure;
  } else if (pass_.groups[g].units_exchanged == 0) {
    try {
      exchange_group(g, std::move(failure));
    } catch (const Error& e) {
      drain_in_flight();
      pass_.error.emplace(e);
      throw;
    }
  } else if (failure) {
    exchange_->defer(*failure);  // this group is already here; the next round carries it
  }
  try {
    pump();
  } catch (const Error& e) {
    exchange_->defer(e);
  }
  return hand_out(item);
}

std::optional<std::pair<std::string, at::Tensor>> Loader::next_in_step() {
  // Each rank reads alone; the ranks meet only at StepRounds' items, so a failure here (a
  // changed file, a read error, no memory) makes this rank's next round at once, where every
  // rank raises together.
  if (pass_.error) throw *pass_.error;
  std::optional<Error> failure;
  try {
    if (!pass_.started) begin_pass();
  } catch (const Error& e) {
    failure = e;
  }
  if (!failure && pass_.rounds_done >= step_rounds_->count()) return std::nullopt;
  const size_t item = pass_.next_item;
  const size_t items = plan_.reads.items.size();
  if (!failure && mode_.host_views) {
    // Nothing to read; a changed file (the next one's, or a held view's) travels with the round
    // instead of raising here alone.
    failure = views_->settle(item);
  } else if (!failure && item < items && !mode_.mapped_iteration) {
    try {
      if (device_ring_placement_) device_ring_placement_->release_consumed(pass_);
      make_ready(item, /*wait=*/true);
      pump();
    } catch (const Error& e) {
      failure = e;
    } catch (const std::exception& e) {  // else the other ranks would wait in their round
      failure = failure_of(e, item);
    }
  }
  if (failure || step_rounds_->item_of(pass_.rounds_done) == item) {
    const std::string& file =
        item < items ? plan_.file_of(plan_.tensor_of_item(item)) : plan_.first_path();
    try {
      exchange_->status_round(failure, file, stats_);
    } catch (const Error& e) {
      drain_in_flight();
      pass_.error.emplace(e);
      throw;
    }
    pass_.rounds_done += 1;
  }
  if (item >= items) {
    if (views_) views_->pass_ended();
    return std::nullopt;
  }
  if (mode_.host_views) return hand_out_view(item);
  return mode_.mapped_iteration ? hand_out_mapped(item) : hand_out(item);
}

}  // namespace instanttensor

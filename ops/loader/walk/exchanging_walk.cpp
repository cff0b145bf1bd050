#include "loader/walk/exchanging_walk.h"

namespace instanttensor::loader {

void ExchangingWalk::begin() {
  exchange_->wait_gathers();
  exchange_->forget_deferred();
  units_exchanged_.assign(reads_.plan().reads.groups.size(), 0);
  reads_.begin();
}

std::optional<Error> ExchangingWalk::landing_failure(size_t g, size_t units) {
  try {
    reads_.wait_until_landed(g, units);
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

void ExchangingWalk::exchange_group(size_t g, std::optional<Error> failure) {
  const PassPlan& plan = reads_.plan();
  const GroupState& state = reads_.state().groups[g];
  size_t& exchanged = units_exchanged_[g];
  const plan::ReadGroup& group = plan.reads.groups[g];
  const std::string& file = plan.file_of(plan.first_tensor(g));
  auto deferred = exchange_->take_deferred();
  if (!failure) failure = std::move(deferred);
  // From the plan, not from state.where: a rank that failed before placing the group must
  // still make the same collectives as the others.
  const bool shares = plan.mode.uses_shares(plan.destination_of(g));
  const size_t units = plan.unit_count(g);
  if (!shares || units == 0) {
    // Read whole by every rank (a tensor that stays on the host) or only empty tensors: a
    // status round alone, so a failure still reaches every rank.
    if (!failure) failure = landing_failure(g, SIZE_MAX);
    exchange_->status_round(failure, file, stats_);
    exchanged = 1;
    return;
  }
  // Unit u's round is posted once this rank's share of it landed and settled after unit u+1's
  // is posted, just before unit u's gather. On a backend that runs its collectives in one queue
  // (NCCL, the simulated device's), a round posted after a gather waits for that gather's
  // bytes, so posting and settling back to back made every unit wait for the one before it.
  // The order is the same on every rank: s0, s1, g0, s2, g1, ..., g(n-1); a failure in round u
  // stops every rank at its settling, with round u+1 posted (drained) and no gather of unit u
  // queued.
  uint64_t own = 0;
  PassTimeline& timeline = reads_.timeline();
  auto gather = [&](size_t u) {
    {
      TimelineSpan waited(timeline, PassTimeline::Kind::StatusWait);
      // The other ranks may be a share behind: meanwhile this rank's readers go on (a rank
      // that failed reads nothing more). Nothing fails there: a failed read stays for the
      // landing wait of its unit, whose round carries it; a submit that throws goes with the
      // next group's first round, as in next().
      try {
        if (!failure) reads_.keep_reading_until([&] { return exchange_->oldest_status_arrived(); });
      } catch (const Error& e) {
        exchange_->defer(e);
      }
      exchange_->settle_status(file, stats_);  // throws on every rank after a failure
    }
    own += exchange_->gather_unit(g, u, plan, state, reads_.loader_stream());
    timeline.instant(PassTimeline::Kind::GatherQueued, plan.memory.layout.unit_bytes);
    exchanged += 1;
  };
  for (size_t u = 0; u < units; ++u) {
    if (!failure) failure = landing_failure(g, u + 1);  // this rank's share of unit u in place
    exchange_->post_status(failure, stats_);
    if (u > 0) gather(u - 1);
  }
  gather(units - 1);
  stats_.bytes_received += group.length - own;
}

std::optional<std::pair<std::string, at::Tensor>> ExchangingWalk::next() {
  const PassState& state = reads_.state();
  const size_t items = reads_.plan().reads.items.size();
  if (state.error) throw *state.error;
  if (state.started && state.next_item >= items) {
    reads_.end();  // the last file's descriptors, as the other walks do
    return std::nullopt;
  }
  size_t item = state.started ? state.next_item : 0;
  if (item >= items) {  // an empty selection: the pass begins and ends here
    begin();
    return std::nullopt;
  }
  std::optional<Error> failure;
  try {
    if (!state.started) begin();
    reads_.release_consumed();
    reads_.make_ready(item, /*wait=*/false);
  } catch (const Error& e) {
    failure = e;
  } catch (const std::exception& e) {  // it travels with the round too
    failure = reads_.failure_of(e, item);
  }
  size_t g = reads_.plan().reads.group_of[item];
  if (state.groups.empty()) {
    if (failure) throw *failure;
  } else if (units_exchanged_[g] == 0) {
    try {
      exchange_group(g, std::move(failure));
    } catch (const Error& e) {
      reads_.fail(e);
    }
  } else if (failure) {
    exchange_->defer(*failure);  // this group is already here; the next round carries it
  }
  try {
    reads_.pump();
  } catch (const Error& e) {
    exchange_->defer(e);
  }
  return reads_.hand_out(item, exchange_.get());
}

}  // namespace instanttensor::loader

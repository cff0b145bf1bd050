// The protocol of a distributed pass, on top of RankExchange's collectives: the layout digest
// and what the handshake agrees on (the smallest device budget, which ranks share a host), one
// status round per unit carrying any failure (so a failure on one rank raises on every rank
// after the same round, and no rank gathers a unit before its round says every share landed),
// deferred failures, and each unit's gather. The walks of ranks drive it
// (loader/walk/), waiting for their own reads between the steps. Consumer thread only.
#pragma once

#include <c10/core/Stream.h>

#include <memory>
#include <optional>
#include <vector>

#include "instanttensor/instanttensor.h"
#include "loader/exchange/host_identity.h"
#include "loader/exchange/rank_exchange.h"
#include "loader/pass/pass_state.h"

namespace instanttensor::loader {

// What must agree across ranks besides the files, headers and selection: the options that shape
// the plan, the units and the rings.
struct LayoutOptions {
  bool copy = true;
  uint64_t buffer_size = 0;
  uint64_t chunk_size = 0;
  uint64_t staging_size = 0;
  bool host_fallback = false;
  bool staged = false;
  int device_type = 0;
  plan::ExchangePolicy exchange = plan::ExchangePolicy::Auto;  // every rank must decide alike
};

// FNV-1a over files (sizes, header lengths), the selected tensors (name, offset, size) and the
// layout options. Pure.
uint64_t layout_digest(const format::Checkpoint& checkpoint, const std::vector<size_t>& selected,
                       const LayoutOptions& options);

class ExchangeProtocol {
 public:
  // `where`: the target (the CPU for host targets). Before any data moves, every rank checks
  // it loads the same thing the same way: Error(Argument) on every rank naming the ranks that
  // differ; agreed_device_budget() is the smallest rank's `device_budget`, and topology() says
  // which ranks share this one's page cache (`host_identity`, host_identity.h).
  ExchangeProtocol(c10::intrusive_ptr<c10d::ProcessGroup> group, c10::Device where, uint64_t digest,
                   uint64_t host_identity, uint64_t device_budget, const std::string& file);

  uint64_t agreed_device_budget() const { return agreed_device_budget_; }
  int rank() const { return exchange_.rank(); }
  int world() const { return exchange_.world(); }
  const HostTopology& topology() const { return topology_; }
  // The mode chose to exchange bytes at `place`: sets up the gathers. Before any gather_unit.
  void prepare_gathers(plan::ExchangePlace place) { exchange_.prepare_gathers(place); }

  // Ranks that read alone but walk in step (StepRounds) make status_round()s too: they defer
  // nothing (a failing rank makes its round at once).

  // A failure found after the current group's round: the next status round carries it.
  void defer(Error failure) { deferred_ = std::move(failure); }
  void forget_deferred() { deferred_.reset(); }

  // A group's exchange is driven by ExchangingWalk::exchange_group, which waits for its own
  // reads between the steps: a group read as rank shares makes one status round and one gather
  // per unit (round u+1 posted before gather u); a group every rank read whole (a host-fallback
  // tensor) or only empty tensors, one status round. Every rank makes the same calls in the same
  // order.
  //
  // The failure deferred so far (the group's first, unless it has its own); forgets it.
  std::optional<Error> take_deferred() {
    auto failure = std::move(deferred_);
    deferred_.reset();
    return failure;
  }
  // One status round carrying `failure` (or 0); throws on every rank when any rank failed.
  void status_round(const std::optional<Error>& failure, const std::string& file, Stats& stats);
  // The same round in two steps (RankExchange::post_status, settle_status): a unit's round is
  // posted once its share landed and settled before its gather, with the next unit's round
  // posted in between, so the round never waits in the backend's queue behind the previous
  // unit's gather.
  void post_status(const std::optional<Error>& failure, Stats& stats);
  void settle_status(const std::string& file, Stats& stats);
  bool oldest_status_arrived() const { return exchange_.oldest_status_arrived(); }
  // After unit `u`'s round: queues its in-place gather (after the copies queued on
  // `loader_stream` when staged; null otherwise) and returns this rank's own bytes in it.
  uint64_t gather_unit(size_t g, size_t u, const PassPlan& plan, const GroupState& state,
                       const c10::Stream* loader_stream);
  // Waits for every queued gather (device backends: the current stream waits).
  void wait_gathers() { exchange_.wait_gathers(); }

 private:
  RankExchange exchange_;
  HostTopology topology_;
  uint64_t agreed_device_budget_ = UINT64_MAX;
  std::optional<Error> deferred_;
};

}  // namespace instanttensor::loader

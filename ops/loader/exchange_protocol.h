// The protocol of a distributed pass, on top of RankExchange's collectives: the layout digest
// and the handshake that checks it (and tells which ranks share a host), one status round per unit
// carrying any failure (so a failure on one rank raises on every rank after the same round),
// deferred failures, and the waits for this rank's share of each unit before its gather. Every rank
// makes the same collective calls in the same order, whatever fails where. Consumer thread only.
#pragma once

#include <c10/core/Stream.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "instanttensor/instanttensor.h"
#include "loader/host_identity.h"
#include "loader/pass_state.h"
#include "loader/rank_exchange.h"

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
  ExchangePolicy exchange = ExchangePolicy::Auto;  // every rank must decide alike
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
  // The mode chose to exchange bytes at `place`: sets up the gathers. Before exchange_group.
  void prepare_gathers(ExchangePlace place) { exchange_.prepare_gathers(place); }

  // Ranks that read alone but walk in step (StepRounds): one status round carrying `failure`
  // (they defer nothing: a failing rank makes its round at once). Throws on every rank when
  // any rank failed.
  void check_in_step(const std::optional<Error>& failure, const std::string& file, Stats& stats);

  // A failure found after the current group's round: the next status round carries it.
  void defer(Error failure) { deferred_ = std::move(failure); }
  void forget_deferred() { deferred_.reset(); }

  // Every unit of group `g` through its status round (carrying `failure`, or a deferred one)
  // and its gather. `shares`: the group was read as rank shares; otherwise every rank read it
  // whole (a host-fallback tensor) and one status round suffices. `wait_landed(u)` waits until
  // this rank's share of the first u units is in place (SIZE_MAX: the whole group), throwing
  // the Error of a failed read. `loader_stream`: gathers are queued after the copies on it
  // (staged), or null. Throws on every rank when any rank failed.
  void exchange_group(size_t g, const PassPlan& plan, GroupState& state, bool shares,
                      std::optional<Error> failure,
                      const std::function<void(size_t units)>& wait_landed,
                      const c10::Stream* loader_stream, Stats& stats);
  // Waits for every queued gather (device backends: the current stream waits).
  void wait_gathers() { exchange_.wait_gathers(); }

 private:
  RankExchange exchange_;
  HostTopology topology_;
  uint64_t agreed_device_budget_ = UINT64_MAX;
  std::optional<Error> deferred_;
};

}  // namespace instanttensor::loader

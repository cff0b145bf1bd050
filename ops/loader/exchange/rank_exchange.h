// The collectives of distributed loading over a c10d ProcessGroup: the handshake's gather of
// every rank's words, a status round's gather of status words, a unit's in-place all-gather
// (or broadcasts), and where they run. What they mean is ExchangeProtocol's.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "instanttensor/error.h"
#include "plan/load_mode.h"
#include "plan/unit_layout.h"

namespace instanttensor::loader {

// How a unit reaches every rank. All-gather is NCCL's primitive for this (one collective, in
// place), and the one the device ring uses on the CPU in tests. gloo's CPU all-gather was
// measured at half the throughput of its broadcast on this project's machines (1.05 vs
// 2.29 GB/s, 16 MiB, 2 ranks), and gloo's support for all-gathering device tensors varies by
// release, so host memory over gloo, and device tensors over gloo, take one broadcast per slice.
enum class GatherMethod { AllGather, Broadcasts };
GatherMethod choose_gather_method(plan::ExchangePlace place, const std::string& backend_name,
                                  c10::DeviceType device);

// "cpu:gloo, cuda:nccl"-style description of a group's backends, for the fallback warning.
std::string describe_backends(c10d::ProcessGroup& group);

// The collectives of one loader, on the group's backend for one device type. Every rank makes
// the same calls in the same order (the loader walks the same plan on every rank). Consumer
// thread only.
class RankExchange {
 public:
  // `device`: where the exchanged bytes live (the target: the CPU for the host exchange). The
  // collectives run on the group's backend for its device type.
  RankExchange(c10::intrusive_ptr<c10d::ProcessGroup> group, c10::Device device);
  int rank() const { return rank_; }
  int world() const { return world_; }
  c10::Device device() const { return device_; }

  // What the handshake agreed on: the smallest device budget (so every rank sizes alike) and
  // every rank's host identity (index: rank).
  struct Agreement {
    uint64_t device_budget = UINT64_MAX;
    std::vector<uint64_t> host_identities;
  };
  // Gathers every rank's digest of files, sizes, headers, selection and layout, its device
  // memory budget and its host identity (host_identity.h). Throws Error(Argument) on every
  // rank, naming the ranks that differ, when the digests do not all match.
  Agreement handshake(uint64_t digest, uint64_t budget, uint64_t host_identity,
                      const std::string& file);
  // How gather() moves a unit, for where the exchange runs (GatherMethod); before any gather.
  void prepare_gathers(plan::ExchangePlace place);

  // The status round of a unit: every rank contributes 0 or its failure (kind and message), the
  // host reads them all once. Throws on every rank when any rank failed (its own error, or
  // "rank N failed: ..."), after waiting for the gathers still in flight, so the group is left
  // with no pending collective and a new loader can use it.
  void check_statuses(const std::optional<Error>& failure, const std::string& file) {
    post_status(failure);
    settle_status(file);
  }
  // The same round in two steps, so the host need not wait for it where it is posted:
  // post_status() queues the round's collective (ordered after the work queued on the current
  // stream, device backends); settle_status() reads the oldest round posted and not yet
  // settled (waiting for it) and throws as check_statuses does, after waiting for every other
  // round posted and every gather in flight. Every rank posts and settles in the same order.
  void post_status(const std::optional<Error>& failure);
  void settle_status(const std::string& file);
  // Whether the oldest round posted has completed (settle_status would not wait); true when
  // none is posted.
  bool oldest_status_arrived() const {
    return posted_.empty() || posted_.front().round.work->isCompleted();
  }

  // Queues the in-place gather of `unit` (world x slice bytes on device(); this rank's slice
  // already in place): one all-gather, or one broadcast per slice (GatherMethod). Ordered after
  // the work queued on the current stream (device backends).
  void gather(at::Tensor unit);
  GatherMethod method() const { return method_; }
  // Waits for every queued gather; device backends make the current stream wait, the host
  // does not. Returns once the bytes may be read on the current stream. Rounds posted and not
  // settled (only after an exception that is not an Error) are waited for and dropped.
  void wait_gathers();

 private:
  // A collective of every rank's words of the same size, in flight: read() waits for it and
  // returns them, rank after rank, on the host.
  struct PendingGather {
    c10::intrusive_ptr<c10d::Work> work;
    std::vector<at::Tensor> input;
    std::vector<std::vector<at::Tensor>> output;
    std::optional<c10::Stream> control;
    at::Tensor read();
  };
  PendingGather start_all_gather(const at::Tensor& contribution);
  at::Tensor all_gather(const at::Tensor& contribution) {
    return start_all_gather(contribution).read();
  }
  // Waits for every round posted and every gather queued, without reading them, so a failing
  // round leaves nothing pending on the group; errors of those waits are dropped.
  void drain() noexcept;
  void abandon_rounds() noexcept;

  struct PostedStatus {
    PendingGather round;
    std::optional<Error> failure;  // this rank's own, rethrown as it is
  };

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  c10::intrusive_ptr<c10d::Backend> backend_;
  c10::Device device_;
  // Device targets: the stream the control messages' copies and reads run on, so a status
  // round's copies never queue behind the gathers the consumer's stream waits for.
  std::optional<c10::Stream> control_;
  GatherMethod method_ = GatherMethod::AllGather;
  int rank_ = 0;
  int world_ = 1;
  std::vector<c10::intrusive_ptr<c10d::Work>> in_flight_;
  std::deque<PostedStatus> posted_;
};

}  // namespace instanttensor::loader

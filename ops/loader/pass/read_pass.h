// The pass that reads: each read group of the plan is placed (Placement: owned memory or a ring
// region), its reads submitted and landed (a GroupFeed: the whole group, or this rank's shares
// through the StagingStream to a device), then its tensors handed out (TensorFactory: owned,
// borrowed, or an owned copy). Reads run ahead of the consumer as far as memory allows.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "loader/access/tensor_memory.h"
#include "loader/pass/group_feed.h"
#include "loader/pass/pass.h"
#include "loader/pass/placement.h"
#include "loader/reads/read_scheduler.h"
#include "loader/transfer/borrow_ring.h"
#include "loader/transfer/staging_stream.h"

namespace instanttensor::loader {

class ExchangeProtocol;

class ReadPass : public Pass {
 public:
  // Composes the placements and feeds `plan.mode` needs. `rank`: this rank's share of each unit
  // when the mode exchanges (0 otherwise). `target` (a concrete index) and `copy` are the
  // options'. Everything referenced outlives the pass.
  ReadPass(const PassPlan& plan, ReadScheduler& reads, TensorMemory& memory, c10::Device target,
           bool copy, int rank, Stats& stats);
  ~ReadPass() override;

  void prepare(size_t item) override;
  std::optional<Error> settle(size_t item) override;
  std::pair<std::string, at::Tensor> hand_out(size_t item) override { return hand_out(item, {}); }
  // With an exchange, the consumer (its stream, or the host) first waits for the gathers.
  std::pair<std::string, at::Tensor> hand_out(size_t item, ExchangeProtocol* gathers);
  // Every read of the pass has landed: the descriptors of the file read last go too.
  void end() override { reads_.release_idle_files(); }
  void drain() noexcept override;
  bool borrows_ring() const override { return host_ring_ != nullptr; }
  void leave_parent_work_behind() override;
  void replace_pool(const std::shared_ptr<pool::RecycledBlocks>& recycled) override;
  uint64_t release_memory() override;

  // The steps ranks exchanging bytes take one by one (loader/walk/exchanging_walk.h).
  //
  // Device rings: the consumer asked for the next tensor, so its work on the tensors handed out
  // so far is queued: their regions are released at this point.
  void release_consumed();
  // Places and submits the group of `item`; waits for it to land unless `wait` is false.
  void make_ready(size_t item, bool wait);
  // Places and submits groups ahead of the consumer, as far as memory allows.
  void pump();
  // Waits until `units` units of `group` have landed (all of them for SIZE_MAX). A failed read
  // or a file changed since open fails the pass (thrown).
  void wait_until_landed(size_t group, size_t units = SIZE_MAX);
  // For a consumer waiting for something other than a read (a status round of the ranks):
  // keeps the reads going as wait_until_landed does (lands what is done, queues its copies,
  // submits into the staging they free), waiting for one read or copy at a time, until
  // `arrived()` or nothing is left to wait for, so the readers do not idle for want of staging
  // meanwhile. Fails nothing: landing stops at a failed read, which the consumer meets when it
  // waits for its group (wait_until_landed); a submit that throws is thrown.
  void keep_reading_until(const std::function<bool()>& arrived);
  // The loader's stream when staged (the gathers queue after its copies); null otherwise.
  const c10::Stream* loader_stream() const;
  // The pass's timeline (the scheduler's), for the walks' own events.
  PassTimeline& timeline() { return reads_.timeline(); }

 private:
  // Every feed submits the reads of the groups placed so far that it serves.
  void submit_placed();
  Placement& placement_for(plan::Destination where);
  bool place_group(size_t group, bool force);
  // Lands what the feeds have finished; a read failure (of a group up to `waited`) fails the
  // pass.
  void land(std::optional<size_t> waited);
  void check_reads();
  // Orders the free of owned device destinations not handed out after the copies queued so far
  // on the loader's stream (DeviceStage::record_use_by_copies).
  void keep_owned_until_copied() noexcept;

  ReadScheduler& reads_;
  TensorMemory& memory_;
  c10::Device target_;
  bool copy_;
  Stats& stats_;
  std::unique_ptr<StagingStream> staging_;         // staged only
  std::vector<std::unique_ptr<GroupFeed>> feeds_;  // every placed group's reads
  std::unique_ptr<OwnedPlacement> host_owned_;
  std::unique_ptr<OwnedPlacement> device_owned_;          // staged only
  std::unique_ptr<RingPlacement> device_ring_placement_;  // staged only
  std::unique_ptr<LoaderStreams> host_streams_;           // with the host ring
  std::unique_ptr<BorrowRing> host_ring_;                 // made on first use
  std::unique_ptr<RingPlacement> host_ring_placement_;
};

}  // namespace instanttensor::loader

// Group feeds: how the placed read groups of a pass get their bytes. The whole-group feed reads
// each group in one read straight into its destination; the share feed (share_feed.h) reads
// this rank's shares of each unit, through the staging stream to a device or in place for the
// host exchange. A new way of reading (GPUDirect Storage, an object store) is a new feed.
// Consumer thread only.
#pragma once

#include <deque>
#include <optional>

#include "instanttensor/error.h"
#include "loader/pass/pass_state.h"
#include "loader/reads/read_scheduler.h"
#include "plan/load_mode.h"

namespace instanttensor::loader {

class GroupFeed {
 public:
  virtual ~GroupFeed() = default;
  // Forgets everything submitted (their reads were drained: a new or abandoned pass).
  virtual void reset() = 0;
  // Submits the reads of the groups placed so far (before `pass.next_group`) that this feed
  // serves, in order, while there is room.
  virtual void submit_placed(PassState& pass) = 0;
  // Lands finished reads in order without waiting: marks groups (or their units) landed.
  // Returns the first read failure of a group up to `waited` (the group the consumer waits for;
  // none: no group), as an Error naming the file and the group's first tensor; landing stops at
  // a failed read it does not report, which stays for a later call.
  virtual std::optional<Error> land(PassState& pass, std::optional<size_t> waited) = 0;
  // The group of a read tag this feed submitted and has not landed yet.
  virtual std::optional<size_t> group_of(uint64_t tag) const = 0;
};

// Each group that does not use shares (mode.uses_shares) read whole, by this rank, into its
// destination: single process, local fallback, a host-fallback tensor.
class WholeGroupFeed : public GroupFeed {
 public:
  // Everything referenced outlives this object.
  WholeGroupFeed(const PassPlan& plan, const plan::LoadMode& mode, ReadScheduler& reads)
      : plan_(plan), mode_(mode), reads_(reads) {}
  void reset() override;
  void submit_placed(PassState& pass) override;
  // A failed group after `waited` is not reported here (the groups before it land and are
  // handed out); the pass still fails on it as soon as the consumer has to wait for a read and
  // the scheduler reports it (ReadPass::check_reads), as before the split.
  std::optional<Error> land(PassState& pass, std::optional<size_t> waited) override;
  std::optional<size_t> group_of(uint64_t tag) const override;

 private:
  const PassPlan& plan_;
  const plan::LoadMode& mode_;
  ReadScheduler& reads_;
  std::deque<size_t> submitted_;  // groups whose read is in flight, in order
  size_t cursor_ = 0;             // the next placed group to consider
};

}  // namespace instanttensor::loader

// The share feed: groups read in units of equal rank slices (the staged path, where one rank
// reads everything, and the exchanges, where each rank reads its slice of every unit). This
// rank's shares are submitted in order while there is room and land in order: through the
// staging stream to the device, in pieces of at most its slice, or (the host exchange) straight
// into their place, in one read each.
#pragma once

#include <deque>
#include <optional>

#include "instanttensor/instanttensor.h"
#include "loader/pass/group_feed.h"
#include "loader/pass/pass_state.h"
#include "loader/reads/read_scheduler.h"
#include "loader/transfer/staging_stream.h"

namespace instanttensor::loader {

class ShareFeed : public GroupFeed {
 public:
  // Serves the groups that use shares (mode.uses_shares). `staging`: null when shares are read in
  // place (host exchange). `rank`: this rank's slice of each unit (0 for one process).
  // Everything referenced outlives this object. Consumer thread.
  ShareFeed(const PassPlan& plan, const plan::LoadMode& mode, ReadScheduler& reads,
            StagingStream* staging, int rank, Stats& stats)
      : plan_(plan), mode_(mode), reads_(reads), staging_(staging), rank_(rank), stats_(stats) {}

  void reset() override;
  // Submits shares while the staging ring has room (in place: all of them).
  void submit_placed(PassState& pass) override;
  // Lands finished shares in order (copies staged ones to the device), counting the units
  // landed in each group (GroupFeed::land).
  std::optional<Error> land(PassState& pass, std::optional<size_t> waited) override;
  std::optional<size_t> group_of(uint64_t tag) const override;

 private:
  // Submits shares of `g` while there is room; true once all are submitted.
  bool submit(size_t g, GroupState& state);

  // One read of this rank's share of a unit (the whole share, or a piece of it when staged).
  struct Share {
    size_t group = 0;
    uint64_t tag = 0;
    uint64_t nbytes = 0;     // 0: this rank has no bytes in the unit
    bool staged = false;     // in the staging stream until copied
    bool ends_unit = false;  // the share's last read: once landed, so is the unit's share
  };
  const PassPlan& plan_;
  const plan::LoadMode& mode_;
  ReadScheduler& reads_;
  StagingStream* staging_;
  int rank_;
  Stats& stats_;
  std::deque<Share> submitted_;   // until landed, in order
  size_t cursor_ = 0;             // the group whose shares are being submitted
  uint64_t share_submitted_ = 0;  // bytes of the next unit's share already submitted
  uint64_t sequence_ = 0;         // tags of shares, unique across passes
};

}  // namespace instanttensor::loader

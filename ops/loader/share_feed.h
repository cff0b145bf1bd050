// The share feed: groups read in units of equal rank slices (the staged path, where one rank
// reads everything, and the exchanges, where each rank reads its slice of every unit). This
// rank's shares are submitted in order while there is room and land in order: through the
// staging stream to the device, or (the host exchange) straight into their place.
#pragma once

#include <deque>
#include <optional>

#include "instanttensor/instanttensor.h"
#include "loader/pass_state.h"
#include "loader/read_scheduler.h"
#include "loader/staging_stream.h"

namespace instanttensor::loader {

class ShareFeed {
 public:
  // `staging`: null when shares are read in place (host exchange). `rank`: this rank's slice of
  // each unit (0 for one process). Everything referenced outlives this object. Consumer thread.
  ShareFeed(const PassPlan& plan, ReadScheduler& reads, StagingStream* staging, int rank,
            Stats& stats)
      : plan_(plan), reads_(reads), staging_(staging), rank_(rank), stats_(stats) {}

  // Forgets every share submitted (their reads were drained: a new or abandoned pass).
  void reset();
  // Submits the shares of groups placed so far (those before `pass.next_group`) that use shares,
  // in order, while there is room.
  void submit_placed(const LoadMode& mode, PassState& pass);
  // Lands finished shares in order (copies staged ones to the device), counting the units landed
  // in each group; never waits. Returns the first read failure, as an Error naming the file and
  // the group's first tensor.
  std::optional<Error> land(PassState& pass);
  // The group of a share's read tag, if it is still waiting.
  std::optional<size_t> group_of(uint64_t tag) const;

 private:
  // Submits shares of `g` while there is room; true once all are submitted.
  bool submit(size_t g, GroupState& state);

  // This rank's share of one unit.
  struct Share {
    size_t group = 0;
    uint64_t tag = 0;
    uint64_t nbytes = 0;  // 0: this rank has no bytes in the unit
    bool staged = false;  // in the staging stream until copied
  };
  const PassPlan& plan_;
  ReadScheduler& reads_;
  StagingStream* staging_;
  int rank_;
  Stats& stats_;
  std::deque<Share> submitted_;  // until landed, in order
  size_t cursor_ = 0;            // the group whose shares are being submitted
  uint64_t sequence_ = 0;        // tags of shares, unique across passes
};

}  // namespace instanttensor::loader

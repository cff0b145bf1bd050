#include "loader/pass/share_feed.h"

#include <algorithm>

#include "loader/reads/read_tags.h"
#include "loader/reads/timing.h"

namespace instanttensor::loader {

void ShareFeed::reset() {
  submitted_.clear();
  cursor_ = 0;
  share_submitted_ = 0;
  if (staging_) staging_->forget_waiting();
}

void ShareFeed::submit_placed(PassState& pass) {
  while (cursor_ < pass.next_group) {
    GroupState& state = pass.groups[cursor_];
    if (!state.landed && mode_.uses_shares(state.where) && !submit(cursor_, state)) return;
    ++cursor_;
  }
}

bool ShareFeed::submit(size_t g, GroupState& state) {
  const plan::ReadGroup& group = plan_.reads.groups[g];
  const size_t units = plan_.unit_count(g);
  while (state.units_submitted < units) {
    auto unit = plan_.memory.layout.unit(group.length, state.units_submitted);
    const uint64_t share_begin = unit.share_begin(rank_);
    const uint64_t share_bytes = unit.share_end(rank_) - share_begin;
    // Through the staging ring a share goes in pieces of at most its slice, each as room
    // allows; in place, in one read (the scheduler cuts it into chunks).
    const uint64_t piece_limit =
        staging_ ? std::max<uint64_t>(plan_.memory.staging_slice, 1) : share_bytes;
    do {
      Share share;
      share.group = g;
      const uint64_t group_offset = share_begin + share_submitted_;
      share.nbytes = std::min(piece_limit, share_bytes - share_submitted_);
      share.ends_unit = share_submitted_ + share.nbytes == share_bytes;
      if (share.nbytes > 0) {
        auto range =
            plan::align_range(group.file_offset + group_offset, share.nbytes, plan_.io_alignment);
        // Counted before the submit: one that throws after queueing some pieces leaves its tag
        // to them, never to a later share.
        share.tag = read_tags::share(sequence_++);
        if (staging_) {
          if (!staging_->submit(group.file_index, range, state.dest + group_offset, share.tag)) {
            return false;
          }
          share.staged = true;
        } else {
          // The host exchange: straight into its place (O_DIRECT widening stays inside the
          // group's aligned span, and only ever writes the file's own bytes there).
          reads_.submit(group.file_index, range, state.dest + group_offset - range.prefix,
                        share.tag);
        }
      }
      submitted_.push_back(share);
      share_submitted_ += share.nbytes;
    } while (share_submitted_ < share_bytes);
    share_submitted_ = 0;
    state.units_submitted += 1;
  }
  return true;
}

std::optional<Error> ShareFeed::land(PassState& pass, std::optional<size_t> waited) {
  while (!submitted_.empty()) {
    Share& share = submitted_.front();
    GroupState& state = pass.groups[share.group];
    if (share.nbytes > 0) {
      if (!reads_.done(share.tag)) {
        // The later shares' reads that are done go to the engine now, and their staging is
        // reused as soon as they are copied: a slow read holds up only its own slice.
        if (staging_) {
          auto start = Clock::now();
          staging_->copy_ready();
          stats_.copy_seconds += seconds_since(start);
        }
        return std::nullopt;
      }
      auto failure = reads_.failure(share.tag);
      if (failure && (!waited || share.group > *waited)) return std::nullopt;
      reads_.forget(share.tag);
      if (failure) {
        const auto& first = plan_.first_tensor(share.group);
        return read_failure_error(*failure, plan_.file_of(first), first.name());
      }
    }
    if (share.staged) {
      auto start = Clock::now();
      state.landed_fence = staging_->copy_oldest();
      stats_.copy_seconds += seconds_since(start);
    }
    if (share.ends_unit) {
      state.units_landed += 1;
      if (state.units_landed == plan_.unit_count(share.group)) state.landed = true;
    }
    submitted_.pop_front();
  }
  return std::nullopt;
}

std::optional<size_t> ShareFeed::group_of(uint64_t tag) const {
  if (!read_tags::is_share(tag)) return std::nullopt;
  for (const auto& share : submitted_) {
    if (share.tag == tag) return share.group;
  }
  return std::nullopt;
}

}  // namespace instanttensor::loader

#include "loader/pass/group_feed.h"

#include <algorithm>

#include "loader/reads/read_tags.h"

namespace instanttensor::loader {

void WholeGroupFeed::reset() {
  submitted_.clear();
  cursor_ = 0;
}

void WholeGroupFeed::submit_placed(PassState& pass) {
  for (; cursor_ < pass.next_group; ++cursor_) {
    GroupState& state = pass.groups[cursor_];
    if (state.landed || mode_.uses_shares(state.where)) continue;
    const plan::ReadGroup& group = plan_.reads.groups[cursor_];
    if (reads_.submit(group.file_index, state.range, state.dest - state.range.prefix,
                      read_tags::group(cursor_)) == 0) {
      state.landed = true;  // nothing to read
    } else {
      submitted_.push_back(cursor_);
    }
  }
}

std::optional<Error> WholeGroupFeed::land(PassState& pass, std::optional<size_t> waited) {
  while (!submitted_.empty()) {
    const size_t g = submitted_.front();
    const uint64_t tag = read_tags::group(g);
    if (!reads_.done(tag)) return std::nullopt;
    auto failure = reads_.failure(tag);
    if (failure && (!waited || g > *waited)) return std::nullopt;
    reads_.forget(tag);
    if (failure) {
      const auto& first = plan_.first_tensor(g);
      return read_failure_error(*failure, plan_.file_of(first), first.name());
    }
    pass.groups[g].landed = true;
    submitted_.pop_front();
  }
  return std::nullopt;
}

std::optional<size_t> WholeGroupFeed::group_of(uint64_t tag) const {
  if (!read_tags::is_group(tag)) return std::nullopt;
  if (std::find(submitted_.begin(), submitted_.end(), tag) == submitted_.end()) return std::nullopt;
  return static_cast<size_t>(tag);
}

}  // namespace instanttensor::loader

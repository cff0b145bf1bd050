#include "loader/reads/pass_timeline.h"

namespace instanttensor::loader {

const char* PassTimeline::name(Kind kind) {
  switch (kind) {
    case Kind::ReadSubmitted:
      return "read_submitted";
    case Kind::Read:
      return "read";
    case Kind::ReadBooked:
      return "read_booked";
    case Kind::StagingPlaced:
      return "staging_placed";
    case Kind::StagingFreed:
      return "staging_freed";
    case Kind::StagingFull:
      return "staging_full";
    case Kind::CopyQueued:
      return "copy_queued";
    case Kind::CopyWait:
      return "copy_wait";
    case Kind::ConsumerWait:
      return "consumer_wait";
    case Kind::TensorOut:
      return "tensor_out";
    case Kind::Open:
      return "open";
    case Kind::StagingLimit:
      return "staging_limit";
    case Kind::StatusWait:
      return "status_wait";
    case Kind::GatherQueued:
      return "gather_queued";
  }
  return "unknown";
}

void PassTimeline::record(Kind kind, Clock::time_point start, Clock::time_point end, uint64_t bytes,
                          uint64_t tag) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (entries_.size() >= kMaxEvents) {
    dropped_ += 1;
    return;
  }
  entries_.push_back(Entry{kind, start, end, bytes, tag});
}

std::vector<TimelineEvent> PassTimeline::events() const {
  auto seconds = [](Clock::time_point t) {
    return std::chrono::duration<double>(t.time_since_epoch()).count();
  };
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<TimelineEvent> out;
  out.reserve(entries_.size());
  for (const auto& e : entries_) {
    out.push_back(TimelineEvent{name(e.kind), seconds(e.start), seconds(e.end), e.bytes, e.tag});
  }
  return out;
}

uint64_t PassTimeline::dropped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return dropped_;
}

}  // namespace instanttensor::loader

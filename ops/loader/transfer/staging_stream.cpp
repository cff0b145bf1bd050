#include "loader/transfer/staging_stream.h"

#include "instanttensor/error.h"
#include "plan/memory_plan.h"

namespace instanttensor::loader {

namespace {
uint64_t round_up(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}
}  // namespace

bool free_room_first(bool refused, size_t reads_in_flight, size_t reads_at_once, bool copy_queued) {
  return refused && copy_queued && reads_in_flight < reads_at_once;
}

StagingStream::StagingStream(DeviceStage& stage, ReadScheduler& reads, uint64_t slice_bytes)
    : stage_(stage), reads_(reads) {
  if (slice_bytes > 0) {
    // One read queued behind each running one: a worker that finishes goes straight on
    // instead of waiting for the consumer's thread (on 2 busy cores, a completion waited
    // 0.5-1.7 ms for it at the 90th percentile, about an 8 MiB read warm; see
    // benchmarks/README.md, 2026-12-07).
    stage_.staging().raise_limit((2 * reads_.reads_at_once() + 2) *
                                 plan::staging_slot_bytes(slice_bytes));
    reads_.timeline().instant(PassTimeline::Kind::StagingLimit, stage_.staging().limit());
  }
}

bool StagingStream::ensure_region(uint64_t span) {
  BorrowRing& staging = stage_.staging();
  if (region_ != nullptr && staging.regions().empty()) {
    // The stage freed its ring (DeviceStage::close, after the reads were drained): nothing of
    // the old region is left.
    held_.clear();
    waiting_.clear();
    drop_region();
  }
  span = round_up(span, staging.alignment());  // what allocate() takes
  if (region_ != nullptr && span <= region_bytes_) return true;
  if (region_ != nullptr) {
    // A read larger than the region (a caller whose slices exceed the one it stated): once
    // nothing is in the region, it is placed again as large as the ring.
    if (!waiting_.empty() || !held_.empty()) return false;
    drop_region();
  }
  if (span > staging.limit() && staging.limit() < staging.capacity()) {
    staging.raise_limit(staging.capacity());
    reads_.timeline().instant(PassTimeline::Kind::StagingLimit, staging.limit());
  }
  if (span > staging.limit()) return false;  // never fits: the caller says so
  region_bytes_ = staging.limit();
  region_ = staging.place(region_bytes_, 0);
  if (region_ == nullptr && staging.regions().empty() && staging.limit() < region_bytes_) {
    // The memory had was smaller than asked (pinning refused: a smaller pinned ring), now
    // allocated: the region is all of it.
    region_bytes_ = staging.limit();
    if (span <= region_bytes_) region_ = staging.place(region_bytes_, 0);
  }
  if (region_ == nullptr) return false;
  free_ = {{0, region_bytes_}};
  return true;
}

void StagingStream::drop_region() {
  // The region is the ring's only one, unless the stage already freed the ring.
  if (region_ != nullptr && !stage_.staging().regions().empty()) stage_.staging().release_oldest();
  region_ = nullptr;
  free_.clear();
}

std::optional<uint64_t> StagingStream::allocate(uint64_t span) {
  // First fit: the lowest memory is reused first, so memory faulted in lazily is touched only
  // as far as the reads in flight need.
  const uint64_t alignment = stage_.staging().alignment();
  const uint64_t length = round_up(span, alignment);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const uint64_t begin = it->first, end = it->first + it->second;
    const uint64_t at = round_up(begin, alignment);
    if (at + length > end) continue;
    free_.erase(it);
    if (at > begin) free_[begin] = at - begin;
    if (at + length < end) free_[at + length] = end - (at + length);
    return at;
  }
  return std::nullopt;
}

void StagingStream::free_memory(uint64_t offset, uint64_t span) {
  uint64_t begin = offset, end = offset + round_up(span, stage_.staging().alignment());
  auto next = free_.lower_bound(begin);
  if (next != free_.end() && next->first == end) {
    end += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second == begin) {
      begin = previous->first;
      free_.erase(previous);
    }
  }
  free_[begin] = end - begin;
  reads_.timeline().instant(PassTimeline::Kind::StagingFreed, span);
}

void StagingStream::reclaim_finished_copies() {
  // The loader's stream runs its copies in the order they were queued: the first unfinished
  // one ends the scan.
  while (!held_.empty() && held_.front().fence.passed("staging_reuse")) {
    free_memory(held_.front().offset, held_.front().span);
    held_.pop_front();
  }
}

bool StagingStream::submit(size_t file_index, const plan::AlignedRange& range, uint8_t* to,
                           uint64_t tag) {
  // A copy still running is not waited for here: blocking on the copy just queued left the copy
  // engine one copy at a time, idle while the host woke up and queued the next (0.92 of a
  // 1 GB/s engine on the simulated device; see benchmarks/device_pipeline.py).
  reclaim_finished_copies();
  std::optional<uint64_t> at;
  if (ensure_region(range.span)) at = allocate(range.span);
  if (!at) {
    reads_.timeline().instant(PassTimeline::Kind::StagingFull, range.span);
    refused_ = true;
    return false;
  }
  refused_ = false;
  reads_.timeline().instant(PassTimeline::Kind::StagingPlaced, range.span, tag);
  uint8_t* data = region_->data + *at;
  // Waiting before it is submitted: a submit that fails after queueing some pieces leaves
  // them to the caller's drain of the waiting slices, before the memory is reused.
  Slice slice;
  slice.tag = tag;
  slice.offset = *at;
  slice.span = range.span;
  slice.staged = data + range.prefix;
  slice.to = to;
  slice.nbytes = range.length;
  waiting_.push_back(slice);
  try {
    reads_.submit(file_index, range, data, tag);
  } catch (...) {
    if (reads_.done(tag)) {  // nothing of it queued: no slice waits for it
      free_memory(*at, range.span);
      waiting_.pop_back();
    } else {
      // Its queued pieces land later; the caller fails and drains, and it is never copied.
      waiting_.back().submit_failed = true;
    }
    throw;
  }
  return true;
}

void StagingStream::copy(Slice& slice) {
  // Before the copy is queued: the engine may start it at once (the simulated one on the
  // device's clock, from the moment it was queued).
  reads_.timeline().instant(PassTimeline::Kind::CopyQueued, slice.nbytes, slice.tag);
  CopyFence copied = stage_.copy_to_device(slice.staged, slice.to, slice.nbytes);
  slice.copied = true;
  slice.copy_number = ++copies_queued_;
  slice.copied_fence = copied;
  held_.push_back(Held{slice.offset, slice.span, copied});
  region_->readers_done = copied;  // the region is freed after its last copy
}

void StagingStream::copy_ready() {
  // Only reads still tracked and successful: a failed one (or one whose failure was booked and
  // forgotten) fails the load at its turn, and one whose submit threw is never copied.
  for (Slice& slice : waiting_) {
    if (!slice.copied && !slice.submit_failed && reads_.succeeded(slice.tag)) copy(slice);
  }
}

CopyFence StagingStream::copy_oldest() {
  Slice& slice = waiting_.front();
  if (slice.submit_failed) {
    throw Error(ErrorKind::Internal, "", "", "copying a staged slice whose read was not submitted");
  }
  if (!slice.copied) copy(slice);
  // The copies run in the order queued: the latest of those taken so far covers them all.
  if (slice.copy_number > taken_copy_number_) {
    taken_copy_number_ = slice.copy_number;
    taken_fence_ = slice.copied_fence;
  }
  waiting_.pop_front();
  return taken_fence_;
}

bool StagingStream::idle_reader_waits_for_room() const {
  return free_room_first(refused_, reads_.in_flight(), reads_.reads_at_once(), !held_.empty());
}

bool StagingStream::wait_oldest_copy() {
  if (held_.empty()) return false;
  TimelineSpan waited(reads_.timeline(), PassTimeline::Kind::CopyWait);
  held_.front().fence.wait("staging_reuse");
  free_memory(held_.front().offset, held_.front().span);
  held_.pop_front();
  return true;
}

void StagingStream::drop_oldest() {
  const Slice& slice = waiting_.front();
  if (!slice.copied) free_memory(slice.offset, slice.span);
  waiting_.pop_front();
}

void StagingStream::forget_waiting() {
  while (!waiting_.empty()) drop_oldest();
}

void StagingStream::release_all() {
  forget_waiting();
  while (wait_oldest_copy()) {
  }
  drop_region();  // every copy that read it has ended
  refused_ = false;
  taken_copy_number_ = 0;
  taken_fence_ = CopyFence();
}

}  // namespace instanttensor::loader

#include "loader/transfer/staging_stream.h"

#include "plan/memory_plan.h"

namespace instanttensor::loader {

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

bool StagingStream::submit(size_t file_index, const plan::AlignedRange& range, uint8_t* to,
                           uint64_t tag) {
  BorrowRing& staging = stage_.staging();
  BorrowRing::Region* region;
  while (!(region = staging.place(range.span, 0))) {
    if (staging.regions().empty() && staging.limit() < staging.capacity()) {
      // A read larger than the limit (a caller whose slices exceed the one it stated).
      staging.raise_limit(staging.capacity());
      reads_.timeline().instant(PassTimeline::Kind::StagingLimit, staging.limit());
      continue;
    }
    // Only the oldest regions, whose bytes were already copied, can be reused; the others stay
    // in flight (freeing by landing everything first left one read in flight: 1.0 -> 0.8 s
    // cold on 1.76 GB). A copy still running is not waited for here: blocking on the copy just
    // queued left the copy engine one copy at a time, idle while the host woke up and queued
    // the next (0.92 of a 1 GB/s engine on the simulated device; see
    // benchmarks/device_pipeline.py).
    if (staging.regions().size() <= waiting_.size() ||
        !staging.regions().front().readers_done.passed("staging_reuse")) {
      reads_.timeline().instant(PassTimeline::Kind::StagingFull, range.span);
      refused_ = true;
      return false;
    }
    release_oldest_slice();
  }
  refused_ = false;
  reads_.timeline().instant(PassTimeline::Kind::StagingPlaced, range.span, tag);
  // Waiting before it is submitted: a submit that fails after queueing some pieces leaves
  // them to the caller's drain of the waiting slices, before the ring is freed.
  waiting_.push_back(Slice{tag, region->data + range.prefix, to, range.length});
  try {
    reads_.submit(file_index, range, region->data, tag);
  } catch (...) {
    // Nothing of it queued (a descriptor or the backend could not be had): no slice waits for
    // it. Its region stays placed until the caller frees the ring, which every caller does
    // after a throw (the read pass fails and forgets its slices; load_into drains and closes).
    if (reads_.done(tag)) waiting_.pop_back();
    throw;
  }
  return true;
}

CopyFence StagingStream::copy_oldest() {
  Slice slice = waiting_.front();
  // Before the copy is queued: the engine may start it at once (the simulated one on the
  // device's clock, from the moment it was queued).
  reads_.timeline().instant(PassTimeline::Kind::CopyQueued, slice.nbytes, slice.tag);
  CopyFence copied = stage_.copy_to_device(slice.staged, slice.to, slice.nbytes);
  // The oldest region not yet copied is this slice's (both are in submission order).
  auto& regions = stage_.staging().regions();
  regions[regions.size() - waiting_.size()].readers_done = copied;
  waiting_.pop_front();
  return copied;
}

bool free_room_first(bool refused, size_t reads_in_flight, size_t reads_at_once, bool copy_queued) {
  return refused && copy_queued && reads_in_flight < reads_at_once;
}

bool StagingStream::idle_reader_waits_for_room() const {
  return free_room_first(refused_, reads_.in_flight(), reads_.reads_at_once(),
                         stage_.staging().regions().size() > waiting_.size());
}

bool StagingStream::wait_oldest_copy() {
  if (stage_.staging().regions().size() <= waiting_.size()) return false;
  TimelineSpan waited(reads_.timeline(), PassTimeline::Kind::CopyWait);
  release_oldest_slice();  // waits on the host for the copy that read it
  return true;
}

void StagingStream::drop_oldest() { waiting_.pop_front(); }

void StagingStream::release_all() {
  waiting_.clear();
  refused_ = false;
  while (!stage_.staging().regions().empty()) release_oldest_slice();
}

void StagingStream::release_oldest_slice() {
  BorrowRing& staging = stage_.staging();
  const uint64_t bytes = staging.regions().front().span;
  staging.release_oldest();
  reads_.timeline().instant(PassTimeline::Kind::StagingFreed, bytes);
}

}  // namespace instanttensor::loader

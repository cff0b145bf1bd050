// The staging stream: reads land in slices of the staging memory and are copied to their device
// destinations; a slice's memory is reused once its copy has read it. Slices are handed back to
// the caller in the order they were submitted, but a slice whose read is done is copied as soon
// as the caller asks (copy_ready), ahead of an older one still reading, and its memory is reused
// as soon as that copy ends: one slow read holds its own slice only, not every slice behind it.
// Used by the loader's shares and by load_into alike.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>

#include "loader/reads/read_scheduler.h"
#include "loader/transfer/borrow_ring.h"
#include "loader/transfer/device_stage.h"
#include "plan/read_plan.h"

namespace instanttensor::loader {

// The consumer is about to block and may wait for a read or for the oldest copy. Freeing the
// copied slice first is right when a read was refused room since the staging last gave any
// (`refused`), a worker is idle (`reads_in_flight` < `reads_at_once`) and a copy is queued
// (`copy_queued`): waiting for a read instead leaves that worker idle until the consumer's
// thread next wakes, though the copy ended long before (read-bound passes stalled 1-5 ms at a
// time so on the simulated device, 2026-12-07). Else the read: its copy is the next work for
// the engine. Pure; any thread.
bool free_room_first(bool refused, size_t reads_in_flight, size_t reads_at_once, bool copy_queued);

class StagingStream {
 public:
  // `stage` and `reads` outlive this object. Consumer thread only. `slice_bytes` > 0: the
  // largest read submitted (the plan's slice); the staging memory is then used only as far as
  // keeps every read the backend runs at once busy with one more queued behind it, plus two
  // slices under copy (a read larger than that takes the whole ring), so memory the platform
  // faults in lazily (pageable staging, lazily pinned memory) is touched only that far. A limit
  // that followed the measured rates was tried and dropped: the consumer's thread books reads
  // and queues copies before it submits, so at a submit it cannot tell an engine behind from
  // copies it has just queued.
  StagingStream(DeviceStage& stage, ReadScheduler& reads, uint64_t slice_bytes = 0);

  // Submits the read of `range` of file `file_index` (tag `tag`) into a fresh staging slice,
  // whose `range.length` wanted bytes are later copied to `to` (device memory). Reuses the
  // memory of slices whose copies have finished to make room, never waiting; returns false when
  // no room is left without a wait: then land the slices whose reads are done (copy_ready,
  // copy_oldest), or wait_oldest_copy(), and submit again.
  bool submit(size_t file_index, const plan::AlignedRange& range, uint8_t* to, uint64_t tag);
  // Queues the copies of the waiting slices whose reads are done and succeeded (booked by the
  // scheduler), in submission order among themselves, ahead of older slices still reading.
  // Their memory is reused once the copies end. Never waits.
  void copy_ready();
  // Blocks the host until the earliest copy queued that still holds staging memory has read it
  // and frees that memory; false (no wait) when no copy holds any.
  bool wait_oldest_copy();
  // True when a consumer about to block should wait for the oldest copy first (then with
  // wait_oldest_copy()): free_room_first() of this stream's state.
  bool idle_reader_waits_for_room() const;
  // Slices submitted and not yet taken by copy_oldest() or drop_oldest(), oldest first.
  size_t waiting() const { return waiting_.size(); }
  uint64_t oldest_tag() const { return waiting_.front().tag; }
  // Takes the oldest waiting slice (its read done and successful), queueing its copy on the
  // loader's stream unless copy_ready() already did; returns a fence after the copies of it and
  // of every slice taken before it (the destinations are filled).
  CopyFence copy_oldest();
  // Gives up the oldest waiting slice without copying it (its read failed; it is done); its
  // memory is free at once unless copy_ready() copied it.
  void drop_oldest();
  // After the reads were drained (an abandoned pass): forgets every waiting slice, so their
  // memory is free for the next pass (once the copies of those already copied end).
  void forget_waiting();
  // Frees all staging memory (host waits for the copies that read it).
  void release_all();

 private:
  struct Slice {
    uint64_t tag = 0;
    uint64_t offset = 0;  // of its memory in the staging region
    uint64_t span = 0;
    const uint8_t* staged = nullptr;  // the wanted bytes
    uint8_t* to = nullptr;
    uint64_t nbytes = 0;
    bool copied = false;
    bool submit_failed = false;  // some of its pieces may be queued: never copied
    uint64_t copy_number = 0;    // 1 for the first copy queued, and so on
    CopyFence copied_fence;
  };
  struct Held {  // memory a queued copy still reads, in the order the copies were queued
    uint64_t offset;
    uint64_t span;
    CopyFence fence;
  };
  // The staging region: [0, region_bytes_) of region_, placed on the first submit.
  bool ensure_region(uint64_t span);
  // Gives the region back to the ring (when nothing reads or copies from it any more).
  void drop_region();
  std::optional<uint64_t> allocate(uint64_t span);
  void free_memory(uint64_t offset, uint64_t span);
  void reclaim_finished_copies();
  void copy(Slice& slice);

  DeviceStage& stage_;
  ReadScheduler& reads_;
  BorrowRing::Region* region_ = nullptr;
  uint64_t region_bytes_ = 0;
  std::map<uint64_t, uint64_t> free_;  // offset -> length, coalesced
  std::deque<Slice> waiting_;
  std::deque<Held> held_;
  uint64_t copies_queued_ = 0;
  uint64_t taken_copy_number_ = 0;  // the latest copy among the slices taken
  CopyFence taken_fence_;
  bool refused_ = false;  // the last submit found no room
};

}  // namespace instanttensor::loader

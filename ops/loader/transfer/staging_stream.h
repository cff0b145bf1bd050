// The staging stream: reads land in slices of the staging ring and are copied to their device
// destinations in the order they were submitted; the oldest slice is freed once its copy has
// been queued and has read it. Used by the loader's shares and by load_into alike.
#pragma once

#include <cstdint>
#include <deque>

#include "loader/reads/read_scheduler.h"
#include "loader/transfer/borrow_ring.h"
#include "loader/transfer/device_stage.h"
#include "plan/read_plan.h"

namespace instanttensor::loader {

// The consumer is about to block and may wait for a read or for the oldest copy. Freeing the
// copied slice first is right when a read was refused room since the ring last gave any
// (`refused`), a worker is idle (`reads_in_flight` < `reads_at_once`) and a copy is queued
// (`copy_queued`): waiting for a read instead leaves that worker idle until the consumer's
// thread next wakes, though the copy ended long before (read-bound passes stalled 1-5 ms at a
// time so on the simulated device, 2026-12-07). Else the read: its copy is the next work for
// the engine. Pure; any thread.
bool free_room_first(bool refused, size_t reads_in_flight, size_t reads_at_once, bool copy_queued);

class StagingStream {
 public:
  // `stage` and `reads` outlive this object. Consumer thread only. `slice_bytes` > 0: the
  // largest read submitted (the plan's slice); the ring is then used only as far as keeps every
  // read the backend runs at once busy with one more queued behind it, plus two slices under
  // copy (a read larger than that takes the whole ring), so memory the platform faults in
  // lazily (pageable staging, lazily pinned memory) is touched only that far. A limit that followed
  // the measured rates was tried and dropped: the consumer's thread books reads and queues copies
  // before it submits, so at a submit it cannot tell an engine behind from copies it has just
  // queued.
  StagingStream(DeviceStage& stage, ReadScheduler& reads, uint64_t slice_bytes = 0);

  // Submits the read of `range` of file `file_index` (tag `tag`) into a fresh staging slice,
  // whose `range.length` wanted bytes are later copied to `to` (device memory). Frees the oldest
  // slices whose copies have finished to make room, never waiting; returns false when no room
  // is left without a wait: then land the slices whose reads are done (their copies queue
  // behind the ones running), or wait_oldest_copy(), and submit again.
  bool submit(size_t file_index, const plan::AlignedRange& range, uint8_t* to, uint64_t tag);
  // Blocks the host until the oldest slice whose copy is queued has been read by it and frees
  // that slice; false (no wait) when no slice has a copy queued.
  bool wait_oldest_copy();
  // Whether a consumer about to block should wait for the oldest copy first (then with
  // wait_oldest_copy()): free_room_first() of this stream's state.
  bool idle_reader_waits_for_room() const;
  // Slices submitted and not yet copied (or dropped), oldest first.
  size_t waiting() const { return waiting_.size(); }
  uint64_t oldest_tag() const { return waiting_.front().tag; }
  // Queues the copy of the oldest waiting slice (its read done and successful) on the loader's
  // stream; returns the fence after it (the destination is filled, the slice may be reused).
  CopyFence copy_oldest();
  // Gives up the oldest waiting slice without copying it (its read failed; it is done).
  void drop_oldest();
  // After the reads were drained (an abandoned pass): forgets every waiting slice, so their
  // space is free for the next pass.
  void forget_waiting() { waiting_.clear(); }
  // Frees every slice (host waits for the copies that read them).
  void release_all();

 private:
  // Frees the ring's oldest region (the host waits for a copy still reading it).
  void release_oldest_slice();

  struct Slice {
    uint64_t tag;
    const uint8_t* staged;  // the wanted bytes in the staging ring
    uint8_t* to;
    uint64_t nbytes;
  };
  DeviceStage& stage_;
  ReadScheduler& reads_;
  std::deque<Slice> waiting_;  // the ring's newest regions, in the same order
  bool refused_ = false;       // the last submit found no room
};

}  // namespace instanttensor::loader

// Borrowed regions over one fixed block of memory (host, pinned or device), with safe borrowing.
#pragma once

#include <c10/core/StorageImpl.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "loader/transfer/stream_fences.h"
#include "pool/ring_allocator.h"

namespace instanttensor::loader {

// Regions are placed at the head and released from the tail, in the order the loader hands
// tensors out. Each handed-out tensor views the ring through a storage of its own, of which the
// region keeps one reference: a use_count above one at release time means the consumer still
// holds the tensor, which is then copied to fresh memory and its storage repointed
// (set_data_ptr_noswap, as torch's own resize and copy-on-write do), so views follow and a kept
// tensor never changes. Consumer thread only.
class BorrowRing {
 public:
  enum class Memory { Host, Pinned, Device };
  struct Region {
    uint64_t pass = 0;
    size_t first_item = 0;
    size_t item_count = 0;
    uint64_t span = 0;
    uint8_t* data = nullptr;
    std::vector<c10::intrusive_ptr<c10::StorageImpl>> storages;
    // Host staging: the device copy that reads these bytes has finished.
    CopyFence readers_done;
    // Device: the consumer's stream has passed its last use of the region's tensors.
    CopyFence released;
    bool release_marked = false;
  };

  // `capacity` bytes on `streams.device()` (Host/Pinned: the CPU), allocated on first use and
  // freed by release_all(). `alignment` is a power of two; `purpose` names the memory in errors.
  // Pinned: where pinning `capacity` is refused, smaller pinned rings down to `min_capacity`
  // (0: capacity; the caller's largest region must still fit twice) are tried before pageable
  // memory of `capacity`.
  BorrowRing(const LoaderStreams& streams, Memory memory, uint64_t capacity, uint64_t alignment,
             const char* purpose, uint64_t min_capacity = 0);
  ~BorrowRing();
  BorrowRing(const BorrowRing&) = delete;
  BorrowRing& operator=(const BorrowRing&) = delete;

  // A region of `span` > 0 bytes starting at an offset congruent to `phase` modulo the
  // alignment, or nullptr when it does not fit until older regions are released.
  Region* place(uint64_t span, uint64_t phase);
  // A storage of `nbytes` at `data` (inside `region`), referenced by the region.
  c10::StorageImpl* borrow(Region& region, uint8_t* data, uint64_t nbytes);
  std::deque<Region>& regions() { return regions_; }
  // Device rings: records, on the consumer's current stream, the point after which `region`
  // may be reused. The consumer calls this when it moves past the region's last tensor.
  void mark_released(Region& region) const;
  // Releases the oldest region: waits on the host for its readers, orders the loader's stream
  // after its release point, copies out the storages still referenced elsewhere, and frees its
  // space. Returns how many storages were copied out. Precondition: !regions().empty().
  uint64_t release_oldest();
  // Releases every region and frees the memory (after the loader's stream finished with it).
  // Host memory: storages still referenced elsewhere take shared ownership of the block instead
  // of being copied (their bytes stay put; the pages none of them covers are given back at once
  // with MADV_DONTNEED; the block goes with the last of them). Returns how many storages were
  // copied out. Idempotent.
  uint64_t release_all();

  // The ring's memory as stats() states it, from its first use on (kept after release_all):
  // "pinned"; "pinned, smaller (<n> of <asked> bytes; pinning <asked> refused: <why>)" where a
  // smaller pinned ring was had; "pageable (pinning refused: <why>)" where none could be pinned
  // (it then stages through pageable memory); each with a warning once per process; "host" or
  // "device" for the other rings; "" before first use.
  const std::string& staging_memory() const { return memory_description_; }

  // The ring's bytes once its memory was allocated (kept after release_all), 0 before: what
  // stats() reports as the loader's staging or device ring.
  uint64_t allocated_bytes() const { return allocated_bytes_; }

  uint64_t bytes_in_use() const { return in_use_; }
  uint64_t capacity() const { return capacity_; }
  // Every region starts at a multiple of this (a power of two).
  uint64_t alignment() const { return alignment_; }
  // Regions are placed in the first `limit` bytes only, so memory the platform faults in lazily
  // is touched only as far as the load needs. Until the first call, all of the ring; the first
  // call sets the limit, later ones only raise it; any time. limit(): the one in force (at most
  // the capacity).
  void raise_limit(uint64_t limit);
  uint64_t limit() const;
  Memory memory() const { return memory_; }

 private:
  void ensure_memory();
  // Pinned memory of capacity_, else of a smaller size down to min_capacity_ (capacity_ then
  // becomes that size), else pageable memory of capacity_.
  void allocate_staging();
  void materialize(c10::StorageImpl& storage) const;
  void hand_over_retained();

  const LoaderStreams& streams_;
  Memory memory_;
  uint64_t capacity_;  // of the memory allocated (a smaller pinned ring: that size)
  const uint64_t requested_;
  const uint64_t min_capacity_;
  uint64_t alignment_;
  const char* purpose_;
  c10::DataPtr block_;
  std::unique_ptr<pool::RingAllocator> allocator_;
  std::deque<Region> regions_;
  uint64_t in_use_ = 0;
  std::string pinning_refused_;     // why the pinned ring asked was refused; empty if it was not
  bool pinned_ = false;             // the block is pinned memory
  std::string memory_description_;  // staging_memory()
  uint64_t allocated_bytes_ = 0;
  uint64_t limit_ = UINT64_MAX;  // raise_limit's, applied to allocator_ once it exists
};

}  // namespace instanttensor::loader

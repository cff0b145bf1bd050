// The transfer stage: host staging ring -> the target device, ordered with events instead of
// host synchronization. Device-generic (c10 guards, streams, events), so the CPU build of this
// file drives CUDA when a CUDA torch is loaded, and a CPU target (force_staging) runs the very
// same code in tests.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>

#include "loader/transfer/borrow_ring.h"
#include "loader/transfer/stream_fences.h"

namespace instanttensor::loader {

class DeviceStage {
 public:
  // `device`: the target, with a concrete index. Reads land in a staging ring of
  // `staging_bytes` (pinned for accelerators, aligned to `staging_alignment` for O_DIRECT; where
  // pinning it is refused, a smaller pinned ring down to `staging_min_bytes`, then pageable) and
  // stream through it in slices into device memory: a device ring of `device_ring_bytes`
  // (borrowed tensors and the exchange; 0: none) or owned device allocations. Nothing is
  // allocated before first use. Consumer thread only, like the Loader that owns it.
  DeviceStage(c10::Device device, uint64_t staging_bytes, uint64_t staging_alignment,
              uint64_t device_ring_bytes, uint64_t staging_min_bytes = 0);
  ~DeviceStage();

  const LoaderStreams& streams() const { return streams_; }
  BorrowRing& staging() { return staging_; }
  BorrowRing& device_ring() { return device_ring_; }

  // Fresh device memory of `nbytes` for an owned tensor, allocated while the consumer's stream
  // is current (the caching allocator ties the block to the stream that will use it).
  c10::DataPtr allocate_owned(uint64_t nbytes) const;
  // Queues a copy of `nbytes` from `from` (host, in the staging ring) to `to` (device) on the
  // loader's stream. Returns the fence after it: the staging bytes are free, `to` is filled.
  CopyFence copy_to_device(const uint8_t* from, uint8_t* to, uint64_t nbytes) const;
  // An owned copy of `nbytes` at device address `from`, queued on the consumer's stream.
  c10::DataPtr copy_on_device(const uint8_t* from, uint64_t nbytes) const;

  // Owned device memory dropped before it was handed out may still be the target of a copy
  // queued on the loader's stream (a staged read's, a gather's). It was allocated on the
  // consumer's stream, whose free does not wait for that copy: on CUDA the caching allocator
  // would hand the block to the next allocation while the copy still writes into it. The two
  // steps below order the free after the copies, with no host wait. Consumer thread.
  //
  // Step one: records a use of `owned` on the loader's stream (torch's record_stream; a no-op
  // for allocators without one, or memory they do not own). False for host memory: nothing to
  // order.
  bool record_use_by_copies(c10::StorageImpl& owned) const noexcept;
  // Step two, once after any number of step ones: the consumer's stream waits for the loader's.
  void order_consumer_after_copies() const noexcept;
  // Both steps for one storage.
  void keep_until_copied(c10::StorageImpl& owned) const noexcept {
    if (record_use_by_copies(owned)) order_consumer_after_copies();
  }

  // Copies out borrowed device tensors still referenced (they must outlive the ring), waits
  // for the copies reading staging memory even if that fails, and frees both rings. Idempotent.
  uint64_t close();

 private:
  LoaderStreams streams_;
  BorrowRing staging_;
  BorrowRing device_ring_;
};

}  // namespace instanttensor::loader

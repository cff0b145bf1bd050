// The transfer stage: host staging bytes -> the target device, owned or borrowed, ordered with
// events instead of host synchronization. Device-generic (c10 guards, streams, events), so the
// CPU build of this file drives CUDA when a CUDA torch is loaded.
#pragma once

#include <ATen/ATen.h>

#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "loader/stream_fences.h"
#include "pool/ring_allocator.h"

namespace instanttensor::loader {

class DeviceStage {
 public:
  // `device`: the target. copy=false borrows from a device ring of `ring_bytes` (allocated on
  // first use). Consumer thread only, like the Loader that owns it.
  DeviceStage(c10::Device device, bool copy, uint64_t ring_bytes);
  ~DeviceStage();

  // Copies `staged` (a host view into the staging ring) to the device on the loader's stream
  // and makes the consumer's current stream wait for it. copy=false: the tensor is a view of
  // the device ring; a region is reused only after the consumer's stream passed the point where
  // the consumer asked for a later tensor (an event, never a host sync), and a tensor still
  // referenced then is first copied to fresh device memory (safe borrowing). Returns the tensor to
  // hand out and, in `staging_free`, the fence after which the staging bytes may be overwritten.
  at::Tensor transfer(const at::Tensor& staged, CopyFence* staging_free);

  // Copies out every borrowed device tensor still referenced (they must outlive the ring) and
  // frees the ring. Idempotent.
  void close();

  uint64_t materializations() const { return materializations_; }
  uint64_t ring_bytes_in_use_peak() const { return peak_; }

 private:
  struct Region {
    c10::intrusive_ptr<c10::StorageImpl> storage;  // one loader reference
    bool live = true;                              // handed out last: not reclaimable yet
    uint64_t size = 0;
  };
  c10::Stream consumer_stream() const;
  void reclaim_oldest(bool force);
  void materialize(Region& region);

  c10::Device device_;
  bool copy_;
  uint64_t ring_bytes_;
  c10::Stream loader_stream_;
  at::Tensor ring_;  // device bytes (copy=false)
  std::unique_ptr<pool::RingAllocator> allocator_;
  std::deque<Region> regions_;
  uint64_t in_use_ = 0;
  uint64_t peak_ = 0;
  uint64_t materializations_ = 0;
};

}  // namespace instanttensor::loader

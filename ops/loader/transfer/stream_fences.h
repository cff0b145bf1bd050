// Ordering work between the loader's stream and the consumer's stream with events, never with
// a host synchronization per tensor. Device-generic (c10 guards, streams, events): the CPU build
// of these files drives CUDA when a CUDA torch is loaded.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <memory>

namespace instanttensor::loader {

// Orders later work after the work queued on a stream so far. On devices with events it wraps
// one; on the CPU (whose copies are synchronous) it is complete from the start.
class CopyFence {
 public:
  CopyFence() = default;
  // Records a fence after the work queued so far on `stream`.
  static CopyFence after(const c10::Stream& stream);
  // Host waits (only where memory is about to be reused under a copy that may be in flight).
  // `site` names the fence for the test-only switch below.
  void wait(const char* site) const;
  // `stream` waits on the device, without blocking the host.
  void block(const c10::Stream& stream, const char* site) const;
  // Whether the work before the fence has finished, without waiting (a dropped fence, below,
  // answers yes).
  bool passed(const char* site) const;

 private:
  std::shared_ptr<c10::Event> event_;
};

// Test-only, in a library built with INSTANTTENSOR_TESTING_HOOKS (a release build drops none):
// INSTANTTENSOR_TESTING_DROP_FENCE=<site> (read at load) makes the fence of that site a
// no-op, so the device tests can show they catch its absence (scripts/check_fences.sh). Sites:
// staging_reuse, release, retained_reads, landed, load_into_start, load_into_done, materialize,
// close, owned_free (the loader's stream recorded on owned memory it drops). Unset: every fence
// holds.
bool fence_dropped(const char* site);

// The loader's own stream on the target device (from the device's pool) and the consumer's
// current stream. On the CPU both are the default stream and every fence is complete at once.
class LoaderStreams {
 public:
  // `device` must carry a concrete index for accelerators. Consumer thread.
  explicit LoaderStreams(c10::Device device);
  c10::Device device() const { return device_; }
  bool has_events() const;
  const c10::Stream& loader() const { return loader_; }
  // The device's current stream at the time of the call: the consumer's.
  c10::Stream consumer() const;
  // Keeps the caching allocator from reusing `data` before the work queued so far on the
  // loader's stream has finished (memory freed on another stream than it was allocated on).
  void record_on_loader(const c10::DataPtr& data) const;

 private:
  c10::Device device_;
  c10::Stream loader_;
};

}  // namespace instanttensor::loader

// The simulated device's memory: a device allocator (addresses host code cannot dereference)
// whose frees wait for the streams that used a block, and a pinned host allocator that counts
// its live bytes.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <functional>

namespace simdev {

// The device allocator (the ATen empty kernels allocate through it).
c10::Allocator* device_allocator_instance();

// recordDataPtrOnStream: the block of `data` is freed only after `stream` passes the work
// queued on it when the block is freed (as CUDA's caching allocator does).
void record_block_use(const c10::DataPtr& data, const c10::Stream& stream);

// Device memory an operation will touch: the host range behind it (real() of a device address)
// and the generation of the live block holding it when the operation was queued (0: none).
// host null: no device memory on that side.
struct DeviceRange {
  const void* host = nullptr;
  size_t nbytes = 0;
  uint64_t generation = 0;
};
// When queuing an operation, any thread.
DeviceRange device_range(const void* host, size_t nbytes);
// When the operation runs: calls `touch` unless a range's block was freed since it was queued
// (or never was one), which counts a stale access (see stale_accesses) and touches nothing. A
// block is not freed while `touch` runs. Any thread.
bool touch_live(const DeviceRange& a, const DeviceRange& b, const std::function<void()>& touch);
// Queued operations that found their device memory already freed, since the library loaded.
uint64_t stale_accesses();

}  // namespace simdev

// The simulated device's memory: a device allocator (addresses host code cannot dereference)
// whose frees wait for the streams that used a block, and a pinned host allocator that counts
// its live bytes.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Stream.h>

namespace simdev {

// The device allocator (the ATen empty kernels allocate through it).
c10::Allocator* device_allocator_instance();

// recordDataPtrOnStream: the block of `data` is freed only after `stream` passes the work
// queued on it when the block is freed (as CUDA's caching allocator does).
void record_block_use(const c10::DataPtr& data, const c10::Stream& stream);

// Whether the host range behind `nbytes` of device memory at `host` (real() of a device address)
// lies in one live device block; if not, counts a stale access (see stale_accesses). Queued
// operations ask before they touch device memory, from any thread.
bool device_range_live(const void* host, size_t nbytes);
// Queued operations that found their device memory already freed, since the library loaded.
uint64_t stale_accesses();

}  // namespace simdev

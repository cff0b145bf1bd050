// Large host allocations for the read path: aligned, huge-page backed where the kernel allows.
#pragma once

#include <c10/core/Allocator.h>

#include <cstdint>

namespace instanttensor::pool {

// A block from allocate_host_block: `bytes` (what was asked, rounded up) at `ptr`; `mapped`: a
// mapping of its own (2 MiB and more), else from malloc.
struct HostBlock {
  void* ptr = nullptr;
  uint64_t bytes = 0;
  bool mapped = false;
};

// The raw block behind allocate_host / allocate_host_window: `nbytes` rounded up to the
// alignment (64 bytes, or 2 MiB with MADV_HUGEPAGE from 2 MiB on, in a mapping of its own; at
// least `min_alignment`). The caller frees it with free_host_block. Throws Error(Io) naming
// `purpose` when memory is exhausted. Any thread.
HostBlock allocate_host_block(uint64_t nbytes, uint64_t min_alignment, const char* purpose);
void free_host_block(const HostBlock& block) noexcept;

// Allocates `nbytes` (may be 0) of host memory aligned to 64 bytes, or to 2 MiB with
// MADV_HUGEPAGE for allocations of 2 MiB and more (first touch of 4 KiB pages costs more than
// the read that fills them). With `prefault`, every page is touched now so later reads do not
// pay the faults. The DataPtr owns the memory and frees it; the device is CPU. Throws Error(Io)
// naming `purpose` when memory is exhausted. Any thread.
c10::DataPtr allocate_host(uint64_t nbytes, bool prefault, const char* purpose);

// Allocates `span` bytes aligned to at least `alignment` (and as allocate_host otherwise) and
// returns a DataPtr whose data pointer is `prefix` bytes in, owning the whole block: an O_DIRECT
// read fills the aligned span and the tensor sees only its own bytes. Any thread.
c10::DataPtr allocate_host_window(uint64_t span, uint64_t prefix, uint64_t alignment,
                                  const char* purpose);

// `nbytes` of page-locked host memory from torch's caching host allocator for `device_type`
// (the staging ring of an accelerator target), aligned to `alignment`. Use a power of two: the
// allocator rounds up to one. The DataPtr returns the block to that cache. Throws what torch
// throws when no accelerator runtime can pin memory. Any thread.
c10::DataPtr allocate_pinned(uint64_t nbytes, uint64_t alignment, c10::DeviceType device_type);

// Returns the pinned blocks cached by torch's host allocator for `device_type` to the system
// (the staging ring's, after close). Never throws. Any thread.
void release_cached_pinned(c10::DeviceType device_type) noexcept;

}  // namespace instanttensor::pool

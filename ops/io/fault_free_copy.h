// Copying out of memory that may fault (torch-free): a file mapping whose file shrank raises
// SIGBUS on a plain memcpy; the kernel's own copy returns EFAULT instead.
#pragma once

#include <cstdint>

namespace instanttensor::io {

// Copies `nbytes` from `from` (any memory of this process: a private file mapping the consumer
// may have written into included) to `to` (ordinary writable memory) and returns the bytes
// copied before the first byte that could not be read (a page past the end of a file truncated
// under its mapping): fewer than `nbytes` means the source shrank. The copy is the kernel's
// (process_vm_readv on this process), so no byte read can raise SIGBUS. Where the kernel refuses
// that call (seccomp, ENOSYS) it is a memcpy, which then carries the risk it removes elsewhere;
// `fault_free_copy_available()` says which. Any thread; no alignment needed.
uint64_t copy_without_faults(void* to, const void* from, uint64_t nbytes) noexcept;

// True when copy_without_faults uses the kernel's copy (asked once per process).
bool fault_free_copy_available() noexcept;

}  // namespace instanttensor::io

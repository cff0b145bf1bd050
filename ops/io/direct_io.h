// What the io layer needs to know about a file before choosing how to read it (torch-free).
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string>

namespace instanttensor::io {

// O_DIRECT constraints of one file: file offsets and lengths must be multiples of
// offset_alignment, buffer addresses multiples of memory_alignment.
struct DirectIoAlignment {
  uint32_t offset_alignment = 4096;
  uint32_t memory_alignment = 4096;
};

// Opens `path` with O_DIRECT | O_RDONLY | O_CLOEXEC and reads its alignment from statx
// (STATX_DIOALIGN), falling back to 4096, which any logical block size up to 4 KiB divides.
// Returns -1 (and leaves errno) when the filesystem refuses O_DIRECT (tmpfs: EINVAL), the
// kernel reports no direct I/O support, or the path is no regular file (EINVAL; a named pipe
// never blocks the open); the caller then reads buffered. `st` (may be null) receives the
// descriptor's fstat. The caller owns the fd.
int open_direct(const std::string& path, DirectIoAlignment* alignment, struct stat* st = nullptr);

// The kernel's page size in bytes, read once (mappings, mincore and unmapping work in pages).
// Any thread.
uint64_t page_size();

// The largest page-cache folio a mapping advised MADV_HUGEPAGE gets: a PMD's size (2 MiB on
// x86-64, 32 MiB on arm64 with 16 KiB pages), as the kernel states it; the page size where it
// states none (no THP). Read once. Any thread.
uint64_t largest_folio_bytes();

// Fraction (0..1) of the file's pages resident in the page cache: exact up to 1 MiB, above
// that estimated from 16 windows of 64 KiB spread over the file (tens of microseconds whatever
// the size). Counts with cachestat(2), or mincore over a mapping that is never touched
// (so a concurrent truncation cannot fault) where cachestat is missing or blocked. 0 for an
// empty file or when the file cannot be inspected. Any thread. allow_cachestat=false forces the
// mincore path (tests).
double resident_fraction(int fd, uint64_t size, bool allow_cachestat = true);

// Asks the kernel to drop the file's clean pages from the page cache (posix_fadvise DONTNEED),
// for cold benchmarks and tests. Returns 0 or an errno.
int evict_from_page_cache(int fd);

}  // namespace instanttensor::io

#include "io/frozen_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "io/fault_free_copy.h"

namespace instanttensor::io {

bool replace_by_copies(uint8_t* start, uint64_t length, uint64_t available) noexcept {
  void* fresh = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (fresh == MAP_FAILED) return false;
  // The kernel's copy: a page past the end (a truncation the lease did not hold back) is zeros.
  (void)copy_without_faults(fresh, start, std::min(length, available));
  if (::mremap(fresh, length, length, MREMAP_MAYMOVE | MREMAP_FIXED, start) == MAP_FAILED) {
    ::munmap(fresh, length);
    return false;
  }
  return true;
}

void restore_file_pages(uint8_t* mapping_start, int fd, uint64_t offset, uint64_t length) noexcept {
  uint8_t* at = mapping_start + offset;
  // Mapped aside, then moved over the copies in one step: a failure on the way leaves the
  // copies in place (a MAP_FIXED mapping that fails may have unmapped its range already).
  void* file =
      ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, static_cast<off_t>(offset));
  if (file != MAP_FAILED) {
    if (::mremap(file, length, length, MREMAP_MAYMOVE | MREMAP_FIXED, at) != MAP_FAILED) return;
    ::munmap(file, length);
  }
  uint64_t done = 0;
  while (done < length) {
    ssize_t got = ::pread(fd, at + done, length - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    done += static_cast<uint64_t>(got);
  }
  std::memset(at + done, 0, length - done);
}

}  // namespace instanttensor::io

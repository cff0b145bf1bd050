#include "io/direct_io.h"

#include <fcntl.h>
#include <linux/stat.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

namespace instanttensor::io {

int open_direct(const std::string& path, DirectIoAlignment* alignment) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return -1;
  DirectIoAlignment found;
  struct statx stx {};
  // Raw syscall: glibc's wrapper may predate the DIOALIGN fields.
  if (::syscall(SYS_statx, fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
      (stx.stx_mask & STATX_DIOALIGN) != 0) {
    if (stx.stx_dio_offset_align == 0) {  // the kernel says: no direct I/O on this file
      ::close(fd);
      errno = EINVAL;
      return -1;
    }
    found.offset_alignment = stx.stx_dio_offset_align;
    found.memory_alignment = stx.stx_dio_mem_align;
  }
  // Buffers and offsets are aligned to the larger of the two (and at least 512): simple and safe.
  uint32_t unit = found.offset_alignment > found.memory_alignment ? found.offset_alignment
                                                                  : found.memory_alignment;
  if (unit < 512) unit = 512;
  found.offset_alignment = found.memory_alignment = unit;
  *alignment = found;
  return fd;
}

double resident_fraction(int fd, uint64_t size) {
  if (size == 0) return 0.0;
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return 0.0;
  long page = ::sysconf(_SC_PAGESIZE);
  uint64_t pages = (size + page - 1) / page;
  std::vector<unsigned char> residency(pages);
  double fraction = 0.0;
  if (::mincore(map, size, residency.data()) == 0) {
    uint64_t resident = 0;
    for (unsigned char flag : residency) resident += flag & 1;
    fraction = static_cast<double>(resident) / static_cast<double>(pages);
  }
  ::munmap(map, size);
  return fraction;
}

int evict_from_page_cache(int fd) { return ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); }

}  // namespace instanttensor::io

#include "io/direct_io.h"

#include <fcntl.h>
#include <linux/stat.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <vector>

#include "format/checkpoint_file.h"

namespace instanttensor::io {

int open_direct(const std::string& path, DirectIoAlignment* alignment, struct stat* st) {
  // Opened as the buffered reads open (never waiting on a named pipe: the kernel refuses
  // O_DIRECT on one at once).
  struct stat own {};
  if (st == nullptr) st = &own;
  int fd = format::open_for_reading(path, st, O_DIRECT);
  if (fd < 0) return -1;
  if (!S_ISREG(st->st_mode)) {
    ::close(fd);
    errno = EINVAL;
    return -1;
  }
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

namespace {
// Files larger than kSampleWindows windows of kSampleWindowBytes are estimated from that many
// windows spread evenly: the exact count costs ~5 ms per GB (mincore: ~20 ms per GB), which a
// warm load of a few GB would feel, and a share against a threshold does not need it. Each
// window is a system call of 1-6 us in a VM (cachestat of a 90 MB file, Linux 6.18 guest: 64
// windows of 256 KiB 270-390 us, most of a small model's open; 16 of 64 KiB 36 us), and 16
// windows put the share within 1/16 of the truth for a file cached in runs.
constexpr uint64_t kSampleWindowBytes = 64ull << 10;
constexpr uint64_t kSampleWindows = 16;

// cachestat(2) (Linux 6.5): counts cached pages of a range without mapping the file. Its number
// is the same on every architecture (the unified table from 424 on).
constexpr long kCachestatSyscall = 451;
struct CachestatRange {
  uint64_t offset, length;
};
struct Cachestat {
  uint64_t cache, dirty, writeback, evicted, recently_evicted;
};

// Cached pages in [offset, offset + length) through mincore over a mapping that is never
// touched (so a concurrent truncation cannot fault). offset is page-aligned. -1 on failure.
int64_t cached_pages_by_mincore(int fd, uint64_t offset, uint64_t length, uint64_t page) {
  void* map = ::mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(offset));
  if (map == MAP_FAILED) return -1;
  std::vector<unsigned char> residency((length + page - 1) / page);
  int64_t resident = -1;
  if (::mincore(map, length, residency.data()) == 0) {
    resident = 0;
    for (unsigned char flag : residency) resident += flag & 1;
  }
  ::munmap(map, length);
  return resident;
}

// Cached pages in the range; cachestat where the kernel (and the sandbox) allows it.
int64_t cached_pages(int fd, uint64_t offset, uint64_t length, uint64_t page, bool* use_cachestat) {
  if (*use_cachestat) {
    CachestatRange range{offset, length};
    Cachestat counts{};
    if (::syscall(kCachestatSyscall, fd, &range, &counts, 0) == 0)
      return static_cast<int64_t>(counts.cache);
    *use_cachestat = false;  // ENOSYS (older kernel) or EPERM (seccomp): mincore from now on
  }
  return cached_pages_by_mincore(fd, offset, length, page);
}
}  // namespace

uint64_t page_size() {
  static const uint64_t size = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

uint64_t largest_folio_bytes() {
  static const uint64_t unit = [] {
    unsigned long long bytes = 0;
    if (FILE* file = std::fopen("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", "r")) {
      if (std::fscanf(file, "%llu", &bytes) != 1) bytes = 0;
      std::fclose(file);
    }
    const uint64_t page = page_size();
    return bytes >= page && bytes % page == 0 ? static_cast<uint64_t>(bytes) : page;
  }();
  return unit;
}

double resident_fraction(int fd, uint64_t size, bool allow_cachestat) {
  if (size == 0) return 0.0;
  const uint64_t page = page_size();
  const uint64_t window = kSampleWindowBytes;
  const bool sampled = size > window * kSampleWindows;
  const uint64_t windows = sampled ? kSampleWindows : 1;
  bool use_cachestat = allow_cachestat;
  uint64_t resident = 0, pages = 0;
  for (uint64_t i = 0; i < windows; ++i) {
    // Evenly spread, page-aligned, the last one ending at the end of the file.
    uint64_t offset = sampled ? (size - window) / (windows - 1) * i / page * page : 0;
    uint64_t length = sampled ? window : size;
    if (offset + length > size) length = size - offset;
    int64_t cached = cached_pages(fd, offset, length, page, &use_cachestat);
    if (cached < 0) return 0.0;
    resident += static_cast<uint64_t>(cached);
    pages += (length + page - 1) / page;
  }
  return pages ? static_cast<double>(resident) / static_cast<double>(pages) : 0.0;
}

int evict_from_page_cache(int fd) { return ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); }

}  // namespace instanttensor::io

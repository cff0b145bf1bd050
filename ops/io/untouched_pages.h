// Reading a file into fresh memory without the kernel zeroing each page first (torch-free).
//
// Fresh anonymous memory costs a page fault and a zeroed page per 4 KiB before a read can copy
// into it: on this project's VM a 262 MB pread into fresh memory took 0.10-0.12 s against
// 0.06-0.08 s through userfaultfd's UFFDIO_COPY, which allocates each page with its bytes
// already in it. copy=True's owned last tensor is such a read (benchmarks/README.md).
#pragma once

#include <cstdint>
#include <memory>

namespace instanttensor::io {

// Private anonymous memory of `nbytes` rounded up to whole pages, page-aligned and never
// touched: what read_into_untouched_pages fills. The deleter unmaps it. Throws std::bad_alloc
// when the kernel refuses the mapping. Any thread.
std::shared_ptr<uint8_t> map_untouched_pages(uint64_t nbytes);

// Whole pages of fresh memory filled by UFFDIO_COPY: the kernel allocates each page with its
// bytes in it. Between construction and close(), nothing may touch the registered pages but
// place() (a user-mode access to a page not yet placed would wait on the userfaultfd forever;
// the kernel's own accesses, a pread into them, fail with EFAULT).
class UntouchedPagePlacer {
 public:
  // Registers the whole pages of [dest, dest + nbytes): memory from map_untouched_pages that
  // nothing has touched. User-mode faults only, so an unprivileged process may do it whatever
  // vm.unprivileged_userfaultfd says. When refused (seccomp, kernels before 5.11, under a page),
  // error() says why and place() places nothing. Never throws.
  UntouchedPagePlacer(uint8_t* dest, uint64_t nbytes) noexcept;
  ~UntouchedPagePlacer() { close(); }
  UntouchedPagePlacer(const UntouchedPagePlacer&) = delete;
  UntouchedPagePlacer& operator=(const UntouchedPagePlacer&) = delete;

  int error() const { return error_; }
  // The bytes registered (whole pages from dest); 0 when error() is set.
  uint64_t registered_bytes() const { return registered_; }
  // Copies `length` bytes (whole pages within the registered ones, none placed before) from
  // `from` to dest + offset. `from` is any readable memory, a file mapping included: a source
  // page that cannot be read (the file truncated under it) stops the copy there, without
  // SIGBUS. Returns the bytes placed. Several threads may place disjoint ranges at once.
  uint64_t place(uint64_t offset, const uint8_t* from, uint64_t length) noexcept;
  // Unregisters: the pages are ordinary memory again (those not placed fault in zeroed).
  // Idempotent; not concurrent with place().
  void close() noexcept;

 private:
  uint8_t* dest_;
  uint64_t registered_ = 0;
  int fd_ = -1;
  int error_ = 0;
};

// What read_into_untouched_pages did.
struct UntouchedRead {
  uint64_t bytes = 0;         // bytes read from the start of dest: nbytes unless it stopped
  int error = 0;              // errno of a failed read; 0 when none failed
  uint64_t copied_pages = 0;  // bytes placed by UFFDIO_COPY (the rest by ordinary preads)
  int userfaultfd_error = 0;  // why userfaultfd was not used, or stopped; 0: it was used
};

// Reads `nbytes` at `offset` of `fd` into `dest`, memory from map_untouched_pages that nothing
// touches until this returns. Whole pages are read into a 4 MiB buffer, then placed (above);
// the partial last page, and everything where userfaultfd is refused or fails part-way, by
// ordinary preads. Stops early, with bytes < nbytes, at the end of the file (it shrank) or a
// failed read. Never throws; holds no fd after; any thread (one call per dest).
UntouchedRead read_into_untouched_pages(int fd, uint64_t offset, uint8_t* dest, uint64_t nbytes);

}  // namespace instanttensor::io

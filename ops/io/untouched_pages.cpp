#include "io/untouched_pages.h"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>

#include "io/direct_io.h"

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1  // Linux 5.11; older headers lack it, older kernels refuse it
#endif

namespace instanttensor::io {

namespace {

constexpr uint64_t kBounceBytes = 4ull << 20;

// Reads up to `length` bytes at `offset`, retrying EINTR and continuing after short reads.
// Returns the bytes read (fewer at end of file or on an error, which lands in *error).
uint64_t pread_fully(int fd, uint8_t* to, uint64_t length, uint64_t offset, int* error) {
  uint64_t done = 0;
  while (done < length) {
    ssize_t got = ::pread(fd, to + done, length - done, static_cast<off_t>(offset + done));
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got < 0) *error = errno;
    if (got <= 0) break;
    done += static_cast<uint64_t>(got);
  }
  return done;
}

}  // namespace

std::shared_ptr<uint8_t> map_untouched_pages(uint64_t nbytes) {
  const uint64_t page = page_size();
  const uint64_t length = std::max<uint64_t>((nbytes + page - 1) / page * page, page);
  void* memory =
      ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) throw std::bad_alloc();
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(memory),
                                  [length](uint8_t* p) { ::munmap(p, length); });
}

UntouchedPagePlacer::UntouchedPagePlacer(uint8_t* dest, uint64_t nbytes) noexcept : dest_(dest) {
  const uint64_t whole_pages = nbytes / page_size() * page_size();
  if (whole_pages == 0) {
    error_ = EINVAL;
    return;
  }
  fd_ = static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY));
  if (fd_ < 0) {
    error_ = errno;
    return;
  }
  uffdio_api api{};
  api.api = UFFD_API;
  uffdio_register registration{};
  registration.range.start = reinterpret_cast<uintptr_t>(dest);
  registration.range.len = whole_pages;
  registration.mode = UFFDIO_REGISTER_MODE_MISSING;
  if (::ioctl(fd_, UFFDIO_API, &api) != 0 || ::ioctl(fd_, UFFDIO_REGISTER, &registration) != 0) {
    error_ = errno;
    close();
    return;
  }
  registered_ = whole_pages;
}

uint64_t UntouchedPagePlacer::place(uint64_t offset, const uint8_t* from,
                                    uint64_t length) noexcept {
  uint64_t placed = 0;
  while (fd_ >= 0 && placed < length) {
    uffdio_copy copy{};
    copy.dst = reinterpret_cast<uintptr_t>(dest_ + offset + placed);
    copy.src = reinterpret_cast<uintptr_t>(from + placed);
    copy.len = length - placed;
    if (::ioctl(fd_, UFFDIO_COPY, &copy) == 0) return length;
    // EAGAIN: the address space changed under the copy (another thread mapping memory); what
    // was copied is in copy.copy, the rest is tried again.
    if (errno != EAGAIN) break;
    if (copy.copy > 0) placed += static_cast<uint64_t>(copy.copy);
  }
  return placed;
}

void UntouchedPagePlacer::close() noexcept {
  if (fd_ >= 0) ::close(fd_);  // unregisters the range
  fd_ = -1;
  registered_ = 0;
}

UntouchedRead read_into_untouched_pages(int fd, uint64_t offset, uint8_t* dest, uint64_t nbytes) {
  UntouchedRead result;
  UntouchedPagePlacer placer(dest, nbytes);
  uint8_t* bounce =
      placer.error() == 0 ? static_cast<uint8_t*>(std::malloc(kBounceBytes)) : nullptr;
  result.userfaultfd_error = placer.error() != 0 ? placer.error() : bounce ? 0 : ENOMEM;
  // Bytes read into the bounce buffer but not placed (a short read, or a refusal part-way):
  // copied in once dest is ordinary memory again.
  uint64_t unplaced = 0;
  uint64_t unplaced_from = 0;
  while (bounce && result.bytes < placer.registered_bytes() && result.error == 0) {
    const uint64_t want = std::min(kBounceBytes, placer.registered_bytes() - result.bytes);
    const uint64_t got = pread_fully(fd, bounce, want, offset + result.bytes, &result.error);
    const uint64_t pages = got / page_size() * page_size();
    const uint64_t placed = placer.place(result.bytes, bounce, pages);
    if (placed < pages) result.userfaultfd_error = errno;
    result.bytes += placed;
    result.copied_pages += placed;
    if (placed < got) {
      unplaced_from = placed;
      unplaced = got - placed;
      break;
    }
    if (got < want) break;  // end of file or a failed read
  }
  placer.close();
  if (unplaced > 0) {
    std::memcpy(dest + result.bytes, bounce + unplaced_from, unplaced);
    result.bytes += unplaced;
  }
  std::free(bounce);
  // The partial last page, or all that userfaultfd did not place (at the end of the file this
  // reads nothing).
  if (result.error == 0) {
    result.bytes += pread_fully(fd, dest + result.bytes, nbytes - result.bytes,
                                offset + result.bytes, &result.error);
  }
  return result;
}

}  // namespace instanttensor::io

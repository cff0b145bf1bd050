#include "io/copies_at_once.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>

#include "io/fault_free_copy.h"

namespace instanttensor::io {

CopiesAtOnce::~CopiesAtOnce() { release_reservation(); }

void CopiesAtOnce::release_reservation() noexcept {
  if (reserve_ && !reserve_lost_) {
    // Only what is left of it: its holes may hold other mappings of the process now.
    uint64_t from = 0;
    for (auto [begin, end] : taken_) {
      if (begin > from) ::munmap(reserve_ + from, begin - from);
      from = end;
    }
    if (reserve_bytes_ > from) ::munmap(reserve_ + from, reserve_bytes_ - from);
  }
  reserve_ = nullptr;  // a lost one stays as it is: address space, never memory
  reserve_lost_ = false;
  taken_.clear();
}

uint8_t* CopiesAtOnce::reserve(uint64_t bytes) noexcept {
  // Address space only, but counted by RLIMIT_AS: where that is set (ulimit -v), a reservation
  // of a file's size could fail the process's other allocations; each copy is mapped alone.
  rlimit limit{};
  if (::getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur != RLIM_INFINITY) return nullptr;
  // PROT_NONE is charged to no commit limit, under vm.overcommit_memory=2 too (which ignores
  // MAP_NORESERVE): a copy's range is made writable, and charged there, as it is filled.
  void* mapped =
      ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mapped == MAP_FAILED) return nullptr;
  auto* start = static_cast<uint8_t*>(mapped);
  // One page touched and given back gives the whole reservation its anonymous memory's identity
  // (the kernel's anon_vma) before any split: the copies cut from it then share it, which is
  // what lets neighbouring ones merge once moved. Made PROT_NONE again, it merges back whole.
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (::mprotect(start, page, PROT_READ | PROT_WRITE) != 0) {
    ::munmap(start, bytes);
    return nullptr;
  }
  *static_cast<volatile uint8_t*>(start) = 0;
  if (::madvise(start, page, MADV_DONTNEED) != 0 || ::mprotect(start, page, PROT_NONE) != 0) {
    ::munmap(start, bytes);
    return nullptr;
  }
  return start;
}

bool CopiesAtOnce::covered(uint64_t page) const noexcept {
  // Ranges of views that share no byte: ordered by first page, their ends are ordered too.
  auto it = live_.upper_bound(page);
  if (it == live_.begin()) return false;
  return std::prev(it)->second > page;
}

bool CopiesAtOnce::replace(uint8_t* mapping_start, uint64_t begin, uint64_t end,
                           uint64_t available) noexcept {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  uint64_t first = begin;
  uint64_t last = end;
  if (first < last && covered(first)) first += page;
  if (first < last && covered(last - page)) last -= page;
  // Where none can be had, each copy is a fresh mapping (an area of its own).
  if (!reserve_ && reserve_bytes_ > 0) reserve_ = reserve(reserve_bytes_);
  if (first < last && !copy_range(mapping_start, first, last, available)) return false;
  try {
    live_.emplace(begin, end);
  } catch (...) {
    return true;  // no memory for the entry: its pages are copies, only never trimmed against
  }
  return true;
}

void CopiesAtOnce::dropped(uint64_t begin, uint64_t end) noexcept {
  auto [from, to] = live_.equal_range(begin);
  for (auto it = from; it != to; ++it) {
    if (it->second == end) {
      live_.erase(it);
      break;
    }
  }
  // No copy alive: the reservation goes too (the file's pages are back everywhere), and the
  // next copy reserves afresh.
  if (live_.empty()) release_reservation();
}

bool CopiesAtOnce::copy_range(uint8_t* mapping_start, uint64_t begin, uint64_t end,
                              uint64_t available) noexcept {
  const uint64_t length = end - begin;
  // The reservation's pages at the same offset, unless a copy took them before (a view kept,
  // dropped and kept again): a fresh mapping then, an area of its own.
  bool from_reserve = reserve_ && !reserve_lost_ && end <= reserve_bytes_;
  if (from_reserve) {
    auto it = taken_.upper_bound(begin);
    if (it != taken_.begin() && std::prev(it)->second > begin) from_reserve = false;
    if (it != taken_.end() && it->first < end) from_reserve = false;
  }
  uint8_t* fresh = nullptr;
  if (from_reserve && ::mprotect(reserve_ + begin, length, PROT_READ | PROT_WRITE) != 0) {
    from_reserve = false;  // no commit for it (or no map area): a fresh mapping may still be had
  }
  if (from_reserve) {
    fresh = reserve_ + begin;
  } else {
    void* mapped =
        ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) return false;
    fresh = static_cast<uint8_t*>(mapped);
  }
  // Where the copy fails, the pages filled so far are given back (the reservation's stay
  // reserved, untouched again and inaccessible).
  auto give_back = [&] {
    if (from_reserve) {
      (void)::madvise(fresh, length, MADV_DONTNEED);
      (void)::mprotect(fresh, length, PROT_NONE);
    } else {
      ::munmap(fresh, length);
    }
  };
  const uint64_t readable = begin < available ? std::min(length, available - begin) : 0;
  try {
    // A byte that could not be read (the file shrank meanwhile) fails the copy: zeros in its
    // place would be wrong bytes; the caller's copy out says what happened.
    const uint64_t copied = copy_ ? copy_(fresh, mapping_start + begin, readable)
                                  : copy_without_faults(fresh, mapping_start + begin, readable);
    if (copied < readable) {
      give_back();
      return false;
    }
  } catch (...) {
    give_back();
    return false;
  }
  if (::mremap(fresh, length, length, MREMAP_MAYMOVE | MREMAP_FIXED, mapping_start + begin) ==
      MAP_FAILED) {
    give_back();
    return false;
  }
  if (!from_reserve) return true;
  // A hole in the reservation now: merged with its neighbours, so the map stays small.
  uint64_t hole_begin = begin;
  uint64_t hole_end = end;
  auto next = taken_.lower_bound(begin);
  if (next != taken_.begin() && std::prev(next)->second == begin) {
    hole_begin = std::prev(next)->first;
    taken_.erase(std::prev(next));
  }
  next = taken_.lower_bound(end);
  if (next != taken_.end() && next->first == end) {
    hole_end = next->second;
    taken_.erase(next);
  }
  try {
    taken_.emplace(hole_begin, hole_end);
  } catch (...) {
    // Unrecorded, the hole could be taken again or unmapped under another mapping: the
    // reservation is given up for good (its untouched pages cost address space only).
    reserve_lost_ = true;
  }
  return true;
}

}  // namespace instanttensor::io

#include "io/copies_at_once.h"

#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <iterator>

#include "io/direct_io.h"
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
  const uint64_t page = page_size();
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

bool CopiesAtOnce::prepare(uint64_t begin, uint64_t end, Replacement& r) noexcept {
  const uint64_t page = page_size();
  r = Replacement{begin, end, begin, end, nullptr, false};
  if (r.first < r.last && covered(r.first)) r.first += page;
  if (r.first < r.last && covered(r.last - page)) r.last -= page;
  try {
    live_.emplace(begin, end);  // before the copy: a neighbour dying meanwhile sees it live
  } catch (...) {
    return false;
  }
  if (r.first >= r.last) return true;  // every page a neighbour's copy already
  // Where no reservation can be had, each copy is a fresh mapping (an area of its own).
  if (!reserve_ && reserve_bytes_ > 0) reserve_ = reserve(reserve_bytes_);
  // The reservation's pages at the same offset, unless a copy took them before (a view kept,
  // dropped and kept again): a fresh mapping then.
  const uint64_t length = r.last - r.first;
  r.from_reserve = reserve_ && !reserve_lost_ && r.last <= reserve_bytes_;
  if (r.from_reserve) {
    auto it = taken_.upper_bound(r.first);
    if (it != taken_.begin() && std::prev(it)->second > r.first) r.from_reserve = false;
    if (it != taken_.end() && it->first < r.last) r.from_reserve = false;
  }
  if (r.from_reserve && ::mprotect(reserve_ + r.first, length, PROT_READ | PROT_WRITE) != 0) {
    r.from_reserve = false;  // no commit for it (or no map area): a fresh mapping may still be
  }
  if (r.from_reserve) {
    r.fresh = reserve_ + r.first;
    return true;
  }
  void* mapped =
      ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) {
    forget_live(begin, end);
    return false;
  }
  r.fresh = static_cast<uint8_t*>(mapped);
  return true;
}

bool CopiesAtOnce::fill(const Replacement& r, const uint8_t* mapping_start,
                        uint64_t available) const noexcept {
  if (r.first >= r.last) return true;
  const uint64_t length = r.last - r.first;
  const uint64_t readable = r.first < available ? std::min(length, available - r.first) : 0;
  try {
    // A byte that could not be read (the file shrank meanwhile) fails the copy: zeros in its
    // place would be wrong bytes; the caller's copy out says what happened.
    const uint64_t copied = copy_ ? copy_(r.fresh, mapping_start + r.first, readable)
                                  : copy_without_faults(r.fresh, mapping_start + r.first, readable);
    return copied >= readable;
  } catch (...) {
    return false;
  }
}

void CopiesAtOnce::give_back(const Replacement& r) noexcept {
  if (r.first >= r.last) return;
  const uint64_t length = r.last - r.first;
  if (r.from_reserve) {
    // Reserved still: untouched again and inaccessible.
    (void)::madvise(r.fresh, length, MADV_DONTNEED);
    (void)::mprotect(r.fresh, length, PROT_NONE);
  } else {
    ::munmap(r.fresh, length);
  }
}

bool CopiesAtOnce::finish(const Replacement& r, uint8_t* mapping_start, bool filled) noexcept {
  const uint64_t length = r.last - r.first;
  const bool moved = filled && (r.first >= r.last ||
                                ::mremap(r.fresh, length, length, MREMAP_MAYMOVE | MREMAP_FIXED,
                                         mapping_start + r.first) != MAP_FAILED);
  if (!moved) {
    give_back(r);
    forget_live(r.begin, r.end);
    return false;
  }
  if (!r.from_reserve || r.first >= r.last) return true;
  // A hole in the reservation now: merged with its neighbours, so the map stays small.
  uint64_t hole_begin = r.first;
  uint64_t hole_end = r.last;
  auto next = taken_.lower_bound(r.first);
  if (next != taken_.begin() && std::prev(next)->second == r.first) {
    hole_begin = std::prev(next)->first;
    taken_.erase(std::prev(next));
  }
  next = taken_.lower_bound(r.last);
  if (next != taken_.end() && next->first == r.last) {
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

void CopiesAtOnce::dropped(uint64_t begin, uint64_t end) noexcept { forget_live(begin, end); }

void CopiesAtOnce::forget_live(uint64_t begin, uint64_t end) noexcept {
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

}  // namespace instanttensor::io

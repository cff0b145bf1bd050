// The private copies a lease-less holder (io/file_lease.h, FileLease::copying_at_once) puts in
// place of kept views of one file mapping. Each copy is filled in a reservation of the
// mapping's size, at the view's own offset, then moved over the view's pages: copies moved from
// one reservation share its anonymous memory's identity and their offsets follow each other, so
// the kernel merges neighbouring ones into one map area (vm.max_map_count counts areas, and
// load_file keeps every view). Torch-free; callers serialize (the lease registry's lock).
#pragma once

#include <cstdint>
#include <map>

namespace instanttensor::io {

// Fills `to`, fresh page-aligned memory nothing has touched, with `nbytes` of `from` without
// ever raising SIGBUS; returns the bytes copied before the first unreadable one. May throw.
using PageCopier = uint64_t (*)(uint8_t* to, const uint8_t* from, uint64_t nbytes);

class CopiesAtOnce {
 public:
  // `copy` fills the copies (the kernel's copy on this thread when null); `reserve_bytes`: the
  // mapping's size in whole pages (views past it get copies of their own).
  CopiesAtOnce(PageCopier copy, uint64_t reserve_bytes) noexcept
      : copy_(copy), reserve_bytes_(reserve_bytes) {}
  ~CopiesAtOnce();
  CopiesAtOnce(const CopiesAtOnce&) = delete;
  CopiesAtOnce& operator=(const CopiesAtOnce&) = delete;

  // Replaces the pages [begin, end) of the mapping at `mapping_start` by private copies, in one
  // step per range (a reader sees the file's page or its copy, never a hole), but for a first or
  // last page a live copy holds already (a neighbour's shared page). Bytes at or past `available`
  // (the file's end) are zeros, never read. The range is then live until dropped(). False when no
  // copy could be made (no memory, no map area): nothing changed then.
  bool replace(uint8_t* mapping_start, uint64_t begin, uint64_t end, uint64_t available) noexcept;
  // The range a replace() made live is no longer held (its view died; the caller maps the
  // file's pages back where no live range needs them).
  void dropped(uint64_t begin, uint64_t end) noexcept;

 private:
  // A reservation of `bytes` of address space; nullptr when none could be had.
  static uint8_t* reserve(uint64_t bytes) noexcept;
  // Unmaps what is left of the reservation and forgets its holes.
  void release_reservation() noexcept;
  bool covered(uint64_t page) const noexcept;
  // Fills [begin, end) of the reservation, or a fresh mapping where the reservation's pages
  // were used before, and moves it over the mapping.
  bool copy_range(uint8_t* mapping_start, uint64_t begin, uint64_t end,
                  uint64_t available) noexcept;

  PageCopier copy_;
  uint8_t* reserve_ = nullptr;  // mapped at a replace, unmapped when no copy is alive
  uint64_t reserve_bytes_;
  bool reserve_lost_ = false;  // a hole went unrecorded: the reservation is never used or unmapped
  std::map<uint64_t, uint64_t> taken_;      // reservation ranges moved out (holes now), merged
  std::multimap<uint64_t, uint64_t> live_;  // replaced ranges still held, by first page
};

}  // namespace instanttensor::io

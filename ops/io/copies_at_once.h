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

  // One replacement of the pages [begin, end) of a mapping by private copies, in three steps so
  // that the copy itself runs without the caller's lock: prepare() and finish() under it,
  // fill() between them, without it.
  struct Replacement {
    uint64_t begin = 0, end = 0;   // the view's pages
    uint64_t first = 0, last = 0;  // those copied: but a first or last page a live copy holds
    uint8_t* fresh = nullptr;      // where they are filled
    bool from_reserve = false;
  };
  // Makes [begin, end) live (a neighbour's first or last page is never copied twice) and
  // readies memory for the pages it copies. False when none could be had: nothing changed.
  bool prepare(uint64_t begin, uint64_t end, Replacement& replacement) noexcept;
  // Fills the copies from the mapping at `mapping_start` (bytes at or past `available`, the
  // file's end, are zeros, never read). False when a byte could not be read (the file shrank)
  // or there was no memory. Any thread; touches nothing but `replacement`'s memory.
  bool fill(const Replacement& replacement, const uint8_t* mapping_start,
            uint64_t available) const noexcept;
  // Moves the filled copies over the mapping in one step per range (a reader sees the file's
  // page or its copy, never a hole) when `filled`; else, or when that fails, gives everything
  // back and the range is not live. Returns whether the pages are copies now.
  bool finish(const Replacement& replacement, uint8_t* mapping_start, bool filled) noexcept;
  // The range a finished replacement made live is no longer held (its view died; the caller maps
  // the file's pages back where no live range needs them).
  void dropped(uint64_t begin, uint64_t end) noexcept;

 private:
  // A reservation of `bytes` of address space; nullptr when none could be had.
  static uint8_t* reserve(uint64_t bytes) noexcept;
  // Unmaps what is left of the reservation and forgets its holes.
  void release_reservation() noexcept;
  bool covered(uint64_t page) const noexcept;
  // Gives back the memory readied for a replacement that will not be moved.
  static void give_back(const Replacement& replacement) noexcept;
  void forget_live(uint64_t begin, uint64_t end) noexcept;

  PageCopier copy_;
  uint8_t* reserve_ = nullptr;  // mapped at a prepare, unmapped when no copy is alive
  uint64_t reserve_bytes_;
  bool reserve_lost_ = false;  // a hole went unrecorded: the reservation is never used or unmapped
  std::map<uint64_t, uint64_t> taken_;      // reservation ranges moved out (holes now), merged
  std::multimap<uint64_t, uint64_t> live_;  // ranges being replaced or held, by first page
};

}  // namespace instanttensor::io

// The views a pass keeps under their files' leases, indexed per file by their bytes, so the two
// questions a step asks (which pages must stay mapped behind the consumer; does a leased view
// show this tensor's bytes) cost a lookup, not a scan of every view kept so far: a consumer
// keeping all of a checkpoint of 20,000 tensors (`dict(f.tensors())`, load_file) made the pass
// quadratic (1.38 s against 0.11 s for 5,000).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "io/file_lease.h"

namespace instanttensor::loader {

// Not thread-safe: the consumer's thread only (PageCacheViews' steps). Holds what keeps each
// view weakly (its protection, or for a view whose copy found no memory, its storage's
// keeper): an entry whose view died, or was made owned, is forgotten when a lookup meets it or
// at forget_ended(). The views of one file never share a byte (a later pass
// reads bytes a leased view shows into owned memory), so ordered by first byte, their page and
// byte ends are ordered too.
class LeasedViews {
 public:
  explicit LeasedViews(size_t files) : by_file_(files) {}

  // A view of `file`'s bytes [offset, offset + nbytes), kept under `protection`. Throws
  // std::bad_alloc (nothing added then).
  void add(size_t file, uint64_t offset, uint64_t nbytes,
           const std::shared_ptr<io::ViewProtection>& protection) {
    add(file, offset, nbytes, protection->begin(), protection->end(), protection);
  }
  // A view of those bytes whose pages [pages_begin, pages_end) stay mapped while `alive` does.
  // Throws std::bad_alloc (nothing added then).
  void add(size_t file, uint64_t offset, uint64_t nbytes, uint64_t pages_begin, uint64_t pages_end,
           std::weak_ptr<const void> alive);
  // True when a live leased view shows some of `file`'s bytes [offset, offset + nbytes).
  bool shows_bytes(size_t file, uint64_t offset, uint64_t nbytes);
  // Calls `kept(first, last)` for the page range [first, last) of each live leased view of
  // `file` that meets the pages [begin, end), in order. Allocates nothing (a pass calls it where
  // it must not fail).
  template <typename Kept>
  void each_kept_page_range(size_t file, uint64_t begin, uint64_t end, Kept kept) {
    each_meeting(by_file_[file], begin, end, pages, kept);
  }
  // Drops the entries of views that died; true when any view is still leased.
  bool forget_ended();

 private:
  struct Entry {
    uint64_t bytes_end;
    uint64_t pages_begin;
    uint64_t pages_end;
    std::weak_ptr<const void> alive;
  };
  using Index = std::map<uint64_t, Entry>;  // by the view's first byte
  static std::pair<uint64_t, uint64_t> pages(const Index::value_type& e) {
    return {e.second.pages_begin, e.second.pages_end};
  }
  static std::pair<uint64_t, uint64_t> bytes(const Index::value_type& e) {
    return {e.first, e.second.bytes_end};
  }
  // Calls `met(first, last)` for each live entry whose [first, last) per `range` meets
  // [begin, end), in order, erasing dead ones met on the way.
  template <typename Range, typename Met>
  static void each_meeting(Index& index, uint64_t begin, uint64_t end, Range range, Met met) {
    // An entry whose first byte is at or past `begin` ends past it; an earlier one reaches into
    // [begin, end) (a shared page) only through its end, and ends are ordered: step back while
    // they do.
    auto it = index.lower_bound(begin);
    while (it != index.begin() && range(*std::prev(it)).second > begin) --it;
    while (it != index.end()) {
      const auto [first, last] = range(*it);
      if (first >= end) break;
      if (it->second.alive.expired()) {
        it = index.erase(it);
        continue;
      }
      if (last > begin) met(first, last);
      ++it;
    }
  }

  std::vector<Index> by_file_;
};

}  // namespace instanttensor::loader

// PageCacheViews' pages behind the consumer: what is unmapped (and dropped from the page cache),
// the advice a read-once pass gives, and a tensor read into owned memory where a view would share
// bytes with a view leased in an earlier pass.
#include <fcntl.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "instanttensor/error.h"
#include "io/direct_io.h"
#include "io/memory_advice.h"
#include "io/untouched_pages.h"
#include "loader/pass/page_cache_views.h"
#include "loader/transfer/storage_views.h"

namespace instanttensor::loader {

at::Tensor PageCacheViews::read_owned(size_t item) {
  const auto& t = plan_.tensor_of_item(item);
  const auto& file = plan_.checkpoint->files()[t.file_index];
  std::shared_ptr<uint8_t> memory = io::map_untouched_pages(t.nbytes);
  uint8_t* to = memory.get();
  const int fd = plan_.checkpoint->descriptor(t.file_index);
  auto read = io::read_into_untouched_pages(fd, t.file_offset, to, t.nbytes);
  if (read.bytes != t.nbytes) {
    throw Error(ErrorKind::Io, file.path, t.name(),
                read.error ? std::string("read failed: ") + errno_message(read.error)
                           : std::string("file shrank during the load (short read)"));
  }
  return owned_tensor(item, data_kept_by(to, std::shared_ptr<const void>(std::move(memory))));
}

void PageCacheViews::unmap_unleased(size_t file, uint64_t begin, uint64_t end,
                                    bool drop_cache) noexcept {
  // Nothing else views the other pages: a later touch would map the file's bytes again. A
  // leased view's pages stay: dropping them would lose an in-place write, or its private copy.
  int fd = -1;
  if (drop_cache && end > begin && plan_.checkpoint->descriptor_in_use(file)) {
    // The descriptor settle() took for the file's views (acquire returns the one in use: no
    // reopen, no check that could fail; use is a flag, so nothing to release here). A file's
    // last range is dropped before drop_pages_behind releases it.
    try {
      fd = plan_.checkpoint->descriptor(file);
    } catch (...) {
      fd = -1;  // cannot happen for a descriptor in use; advice is skipped, never raised
    }
  }
  auto unmap = [&](uint64_t from, uint64_t to) {
    if (to <= from) return;
    // Refused, the pages stay mapped (resident) until the mapping goes at close: counted.
    (void)io::advise(mapping_->data(file) + from, to - from, MADV_DONTNEED,
                     "unmapping page cache views behind the consumer");
    // Advice as well: pages another process maps, or one it is reading, stay.
    if (fd >= 0)
      ::posix_fadvise(fd, static_cast<off_t>(from), static_cast<off_t>(to - from),
                      POSIX_FADV_DONTNEED);
  };
  kept_.each_kept_page_range(file, begin, end, [&](uint64_t kept_begin, uint64_t kept_end) {
    unmap(begin, std::min(kept_begin, end));
    begin = std::max(begin, kept_end);
  });
  unmap(begin, end);
}

void PageCacheViews::advise_read_once() noexcept {
  if (cache_use_ == CacheUse::Keep) return;
  // Advice: a kernel that refuses it (EINVAL, counted: io::advise) leaves the default recency.
  // MADV_HUGEPAGE as well: the pages a populate or a fault reads come in 2 MiB folios
  // (filesystems with large folios: ext4 on 6.x, xfs; elsewhere faults read ahead 4 MiB of
  // 4 KiB pages), a fraction of the per-page work of allocating, inserting, mapping and dropping
  // them. 30 GB cold, populated: 2.65-2.67 GB/s against 1.63-1.73 (benchmarks/README.md). Not
  // below half of memory (CacheUse::Keep): the 0.94 GB checkpoint cold read slower with it
  // (0.57 s against 0.45 s). Whole mappings only: advice on part of one splits it in the
  // kernel's map (vm.max_map_count), so views leased earlier are advised with the rest.
  for (size_t file = 0; file < dropped_up_to_.size(); ++file) {
    uint8_t* start = mapping_->data(file);
    (void)io::advise(start, mapping_->size(file), MADV_SEQUENTIAL, "a file read once");
    (void)io::advise(start, mapping_->size(file), MADV_HUGEPAGE, "a file read once");
  }
}

uint64_t PageCacheViews::drop_unit() const noexcept {
  // Read once, the mapping's folios are that large: POSIX_FADV_DONTNEED drops only the folios
  // wholly inside its range, so one cut at a range's end would stay cached for good, and
  // unmapping part of a folio mapped whole unmaps all of it, the held view's pages too.
  return cache_use_ == CacheUse::Keep ? io::page_size() : io::largest_folio_bytes();
}

void PageCacheViews::advise_kept() noexcept {
  if (cache_use_ == CacheUse::Keep || !kept_.any_leased()) return;
  // The leased views are the consumer's weights now: the default recency, whole mappings (a
  // range per view would split each mapping into one area per view). MADV_HUGEPAGE stays.
  for (size_t file = 0; file < dropped_up_to_.size(); ++file) {
    (void)io::advise(mapping_->data(file), mapping_->size(file), MADV_NORMAL, "leased views");
  }
}

}  // namespace instanttensor::loader

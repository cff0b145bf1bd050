// PageCacheViews' part that keeps views under a lease on their file (io/file_lease.h): the
// kept view itself, the pages it keeps mapped, and a later pass that must not share its bytes.
#include <fcntl.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "instanttensor/error.h"
#include "io/direct_io.h"
#include "io/untouched_pages.h"
#include "loader/pass/page_cache_views.h"
#include "loader/transfer/storage_views.h"

namespace instanttensor::loader {

bool PageCacheViews::shown_by_a_leased_view(size_t item) {
  if (!leased_before_this_pass_) return false;  // the first pass: no lookup per step
  const auto& t = plan_.tensor_of_item(item);
  return leased_.shows_bytes(t.file_index, t.file_offset, t.nbytes);
}

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

io::FileLease* PageCacheViews::lease_of(size_t file) noexcept {
  if (!leases_[file]) {
    try {
      leases_[file] = io::FileLease::take(plan_.checkpoint->descriptor(file));
    } catch (...) {
      // No memory, or the file is no longer the one validated: kept views of it are copied out.
      leases_[file] = nullptr;
    }
  }
  return leases_[file]->get();
}

bool PageCacheViews::keep_under_lease(const Held& held) noexcept {
  const auto& t = plan_.tensor_of_item(held.item);
  // A small view takes its file's lease (a descriptor) only once a second view of the file is
  // kept (load_file keeps them all), or when the lease is there already: a single one held for
  // a step past its own (vLLM's groupby reads ahead) is copied out.
  if (held.storage->nbytes() < leased_view_min_bytes_ && !leases_[t.file_index] &&
      ++small_views_kept_[t.file_index] < 2) {
    return false;
  }
  io::FileLease* lease = lease_of(t.file_index);
  if (!lease) return false;
  try {
    plan_.checkpoint->check_unchanged(t.file_index, t.name());
    c10::StorageImpl& storage = *held.storage;
    auto* data = static_cast<uint8_t*>(storage.mutable_data());
    uint8_t* start = mapping_->data(t.file_index);
    auto protection = lease->protect(start, static_cast<uint64_t>(data - start), storage.nbytes());
    if (!protection) return false;
    leased_.add(t.file_index, t.file_offset, t.nbytes, protection);
    advise_kept(data, storage.nbytes());
    // The view's storage keeps the mapping and now its protection: the lease holds while any
    // view of it lives, after close too.
    struct MappingUnderLease {
      std::shared_ptr<const io::MappedFiles> mapping;
      std::shared_ptr<io::ViewProtection> protection;
    };
    auto both =
        std::make_shared<MappingUnderLease>(MappingUnderLease{mapping_, std::move(protection)});
    storage.set_data_ptr_noswap(data_kept_by(data, std::move(both)));
    stats_.leased_views += 1;
    return true;
  } catch (...) {
    return false;  // changed since open, or no memory: make_owned says which
  }
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
    ::madvise(mapping_->data(file) + from, to - from, MADV_DONTNEED);
    // Advice as well: pages another process maps, or one it is reading, stay.
    if (fd >= 0)
      ::posix_fadvise(fd, static_cast<off_t>(from), static_cast<off_t>(to - from),
                      POSIX_FADV_DONTNEED);
  };
  leased_.each_kept_page_range(file, begin, end, [&](uint64_t kept_begin, uint64_t kept_end) {
    unmap(begin, std::min(kept_begin, end));
    begin = std::max(begin, kept_end);
  });
  unmap(begin, end);
}

void PageCacheViews::advise_read_once() noexcept {
  if (cache_use_ == CacheUse::Keep) return;
  // Advice: a kernel that refuses it (EINVAL, ignored) leaves the default recency.
  // MADV_HUGEPAGE as well: the pages a populate or a fault reads come in 2 MiB folios
  // (filesystems with large folios: ext4 on 6.x, xfs; elsewhere faults read ahead 4 MiB of
  // 4 KiB pages), a fraction of the per-page work of allocating, inserting, mapping and dropping
  // them. 30 GB cold, populated: 2.65-2.67 GB/s against 1.63-1.73 (benchmarks/README.md). Not
  // below half of memory (CacheUse::Keep): the 0.94 GB checkpoint cold read slower with it
  // (0.57 s against 0.45 s). Leased views keep it: MADV_NORMAL resets only the recency.
  for (size_t file = 0; file < dropped_up_to_.size(); ++file) {
    uint8_t* start = mapping_->data(file);
    ::madvise(start, mapping_->size(file), MADV_SEQUENTIAL);
    ::madvise(start, mapping_->size(file), MADV_HUGEPAGE);
    leased_.each_kept_page_range(file, 0, mapping_->size(file), [&](uint64_t from, uint64_t to) {
      ::madvise(start + from, to - from, MADV_NORMAL);
    });
  }
}

uint64_t PageCacheViews::drop_unit() const noexcept {
  // Read once, the mapping's folios are that large: POSIX_FADV_DONTNEED drops only the folios
  // wholly inside its range, so one cut at a range's end would stay cached for good, and
  // unmapping part of a folio mapped whole unmaps all of it, the held view's pages too.
  return cache_use_ == CacheUse::Keep ? io::page_size() : io::largest_folio_bytes();
}

void PageCacheViews::advise_kept(const uint8_t* data, uint64_t length) noexcept {
  if (cache_use_ == CacheUse::Keep || length == 0) return;
  const uint64_t page = io::page_size();
  const auto address = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = address / page * page;
  ::madvise(reinterpret_cast<void*>(first), address + length - first, MADV_NORMAL);
}

}  // namespace instanttensor::loader

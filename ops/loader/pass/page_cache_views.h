// Host iteration over views of the page cache: a tensor is a view of the file's private mapping
// during its step; one the consumer still holds when the pass moves on is KeptViews' to decide
// (kept_views.h). Unmapping and advice behind the consumer: page_cache_views_pages.cpp.
#pragma once

#include <c10/core/StorageImpl.h>

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "instanttensor/instanttensor.h"
#include "io/mapped_files.h"
#include "io/page_cache_read_ahead.h"
#include "loader/access/tensor_factory.h"
#include "loader/pass/kept_views.h"
#include "loader/pass/pass_state.h"
#include "plan/host_policy.h"

namespace instanttensor::loader {

// What a pass does with the page cache behind its consumer (plan/host_policy.h chooses).
using CacheUse = plan::CacheUse;

// A private mapping of every file of `checkpoint`, for PageCacheViews: made when the mode is
// chosen, before the memory plan, so a file that cannot be mapped (Error(Io) naming it) leaves
// the read path planned as such. Any thread.
std::shared_ptr<const io::MappedFiles> map_for_views(const format::Checkpoint& checkpoint);

// The host target's way through a pass (copy=true and copy=false alike, not the explicit
// mmap+borrow contract): nothing is read into loader memory. Each tensor handed out is a view of
// a private mapping of its file, through a storage of its own (KeptViews::make_view); read-ahead
// workers populate the mapping up to `window` bytes ahead of the consumer (a small selection:
// the consumer's thread advises the kernel to fetch them instead). When the consumer asks for the
// next tensor, every view handed out before the one it asked for last (which a `for` loop still
// binds) is decided by KeptViews (kept_views.h: let go, leased, or copied into owned memory), so
// a kept tensor never changes again and a consumer that copies and drops pays one copy, its own.
// Without a lease the last tensor of the pass (1 MiB or more) is read into owned memory by a
// worker beside the consumer (buffered pread), since the loop that asks for it still binds it
// when the handle closes, which would copy it on the consumer's time. Pages behind every view
// still checked are unmapped (MADV_DONTNEED), those of leased views excepted, so resident memory
// stays within the window plus the views held. A later pass reads a tensor that a leased view of
// an earlier pass still shows into owned memory instead, so the two never share bytes.
//
// With CacheUse::ReadOnce (a checkpoint that cannot stay in the page cache beside the weights
// loaded from it), each pass advises the files' mappings MADV_HUGEPAGE (2 MiB folios: a fraction
// of the per-page work) and MADV_SEQUENTIAL, so the pages unmapped behind the consumer are not
// promoted to the kernel's active list and leave before the rest of the page cache (in whole
// folios: the ranges end at a folio unit). A mapping with views leased in the pass is advised
// MADV_NORMAL again, whole, when the pass ends (they are the consumer's weights now: their
// references count); whole, never per view, so the mapping is never split into one area per
// kept view (vm.max_map_count). With CacheUse::ReadOnceAndDrop the ranges unmapped behind the
// consumer are dropped from the page cache too (pages still mapped, a leased view's, stay: the
// kernel never drops a mapped page).
//
// Consumer thread only (the loader's lock); the read-ahead workers only call madvise.
class PageCacheViews {
 public:
  // Over `mapping` (map_for_views of the plan's checkpoint), its next `window` bytes brought in
  // as `read_ahead` says, the page cache used as `cache_use` says (above). `plan`, `factory` and
  // `stats` outlive this part.
  PageCacheViews(const PassPlan& plan, std::shared_ptr<const io::MappedFiles> mapping,
                 TensorFactory& factory, Stats& stats, uint64_t window,
                 io::ReadAheadPolicy read_ahead, CacheUse cache_use);
  ~PageCacheViews();
  PageCacheViews(const PageCacheViews&) = delete;
  PageCacheViews& operator=(const PageCacheViews&) = delete;

  // A new pass: views still held from the last one are made owned first.
  void begin_pass();
  // The step to `item` (items.size(): the end of the pass) without handing anything out: the
  // views before the last one handed out (all of them at the end) are checked, pages behind
  // unmapped, and `item`'s file checked. A change of a file is returned, not thrown, so ranks in
  // step carry it in their status round.
  std::optional<Error> settle(size_t item) noexcept;
  // The view of `item` (a non-empty tensor), after settle(item). Throws Error(Io) naming the file
  // and the tensor when the file changed since open (a held view whose bytes changed under it
  // included, after making it owned).
  at::Tensor hand_out(size_t item);
  // The pass ran out of tensors: every view still held is leased or made owned (as at a step;
  // the last one included).
  void pass_ended();
  // Every view still held is leased or made owned (close, restart); never throws for a changed
  // file (a view whose bytes are gone gets zeros past the file's new end, and is counted).
  void release_all() noexcept;
  // In a forked child: the read-ahead workers were the parent's.
  void abandon_after_fork();
  // "views of the page cache (MADV_POPULATE_READ, 4 workers)", for stats()["backend"].
  std::string description() const;

 private:
  // The last tensor, read into owned memory by a thread of its own.
  struct OwnedTail {
    size_t item = SIZE_MAX;  // SIZE_MAX: none (small, or a forked child)
    bool started = false;
    bool complete = false;  // written by the reader; read after joining it
    c10::DataPtr data;
    std::thread reader;
  };
  // madvise(MADV_DONTNEED) over [begin, end) of `file`'s mapping, leased views' pages excepted;
  // with `drop_cache`, those pages dropped from the page cache too (posix_fadvise).
  void unmap_unleased(size_t file, uint64_t begin, uint64_t end, bool drop_cache = false) noexcept;
  // Not CacheUse::Keep: every file's mapping MADV_SEQUENTIAL and MADV_HUGEPAGE (2 MiB folios).
  void advise_read_once() noexcept;
  // Not CacheUse::Keep, views leased (this pass, or an earlier one and still alive): every
  // file's mapping MADV_NORMAL, whole.
  void advise_kept() noexcept;
  // What the ranges unmapped (and dropped) behind the consumer end at multiples of (the file's
  // end excepted): the page, or read once the largest folio advise_read_once's mapping gets.
  uint64_t drop_unit() const noexcept;
  // `item` read by pread into owned memory. Throws Error(Io) naming the file and the tensor.
  at::Tensor read_owned(size_t item);
  // The tensor of `item` over `data`, owned memory holding its bytes (the tail, read_owned),
  // counted as read. Throws Error(Io) when its file changed since open.
  at::Tensor owned_tensor(size_t item, c10::DataPtr data);
  // Unmaps the pages before the oldest view still held (or `next_item`'s first byte), and
  // releases the descriptors of the files wholly behind it.
  void drop_pages_behind(size_t next_item) noexcept;
  // Releases `file`'s descriptor (the checkpoint's), unless the tail's reader still reads it: a
  // checkpoint of many shards holds the descriptors of one or two at a time.
  void release_descriptor(size_t file) noexcept;
  // Starts reading the last tensor (allocation failure: it stays a view).
  void start_tail_read() noexcept;
  // The owned last tensor, once read whole; nullopt: hand out its view instead.
  std::optional<at::Tensor> take_tail();
  void stop_tail() noexcept;

  const PassPlan& plan_;
  TensorFactory& factory_;
  Stats& stats_;
  std::shared_ptr<const io::MappedFiles> mapping_;
  KeptViews kept_;
  std::unique_ptr<io::PageCacheReadAhead> read_ahead_;
  std::vector<uint64_t> position_of_item_;  // bytes of the items before it, in pass order
  std::vector<uint64_t> dropped_up_to_;     // per file: pages before this offset are unmapped
  uint64_t window_;
  CacheUse cache_use_;
  size_t last_handed_out_ = SIZE_MAX;
  OwnedTail tail_;
};

}  // namespace instanttensor::loader

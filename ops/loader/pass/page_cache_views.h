// Host iteration over views of the page cache: a tensor is a view of the file's private mapping
// during its step; one the consumer still holds when the pass moves on is leased (the lease
// part is in page_cache_views_leases.cpp) or made owned.
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
#include "io/file_lease.h"
#include "io/mapped_files.h"
#include "io/page_cache_read_ahead.h"
#include "loader/access/tensor_factory.h"
#include "loader/pass/leased_views.h"
#include "loader/pass/pass_state.h"

namespace instanttensor::loader {

// What a pass does with the page cache behind its consumer.
enum class CacheUse {
  // The kernel's recency: a checkpoint that fits keeps its pages cached for the next load.
  Keep,
  // A checkpoint larger than half of memory, which cannot stay cached beside the weights loaded
  // from it: its mappings are advised MADV_SEQUENTIAL, so the pages unmapped behind the consumer
  // leave the cache before the rest of it (a working set the system uses).
  ReadOnce,
  // ReadOnce, for a checkpoint larger than memory with no other rank on this host: the pages
  // behind the consumer are also dropped from the page cache (POSIX_FADV_DONTNEED), so the
  // kernel's reclaim never has to find them. Not with ranks on this host, which may not have
  // read them yet; not for a smaller checkpoint, whose pages a next load may find.
  ReadOnceAndDrop,
};

// A private mapping of every file of `checkpoint`, for PageCacheViews: made when the mode is
// chosen, before the memory plan, so a file that cannot be mapped (Error(Io) naming it) leaves
// the read path planned as such. Any thread.
std::shared_ptr<const io::MappedFiles> map_for_views(const format::Checkpoint& checkpoint);

// The host target's way through a pass (copy=true and copy=false alike, not the explicit
// mmap+borrow contract): nothing is read into loader memory. Each tensor handed out is a view of
// a private mapping of its file, through a storage of its own of which this part keeps one
// reference; read-ahead workers populate the mapping up to `window` bytes ahead of the consumer
// (a small selection: the consumer's thread advises the kernel to fetch them instead).
// When the consumer asks for the next tensor, every view handed out before the one it asked for
// last (which a `for` loop still binds) is checked: one dropped costs nothing; one of 1 MiB or
// more (or a smaller one, once another view of its file was kept) still held elsewhere stays a
// view under a read lease on its file (io/file_lease.h: a writer's open or a truncation waits
// until its pages are replaced by private copies at the same addresses), or, where the kernel
// refuses the lease (and a file's first small one), is copied into owned memory and its storage
// repointed (set_data_ptr_noswap, as the borrow ring does). Either way it never changes again, and
// a consumer that copies and drops pays one copy, its own. Without a lease the last tensor of the
// pass (1 MiB or more) is read into owned memory by a worker beside the consumer (buffered pread),
// since the loop that asks for it still binds it when the handle closes, which would copy it on the
// consumer's time. Pages behind every view still checked are unmapped (MADV_DONTNEED), those of
// leased views excepted, so resident memory stays within the window plus the views held. A later
// pass reads a tensor that a leased view of an earlier pass still shows into owned memory instead,
// so the two never share bytes.
//
// With CacheUse::ReadOnce (a checkpoint that cannot stay in the page cache beside the weights
// loaded from it), each pass advises the files' mappings MADV_HUGEPAGE (2 MiB folios: a fraction
// of the per-page work) and MADV_SEQUENTIAL, so the pages unmapped behind the consumer are not
// promoted to the kernel's active list and leave before the rest of the page cache (in whole
// folios: the ranges end at a folio unit). The pages of a leased view are advised MADV_NORMAL
// again when it is kept (it is the consumer's weight now: its references count), at each pass's
// start too, since a lease broken by a writer maps its range afresh (30 GB on 23.5 GiB: 7
// million pages promoted per load and a 3 GB file read just before evicted whole; read once, 15
// thousand and the file kept cached, as under safetensors; benchmarks/README.md). With
// CacheUse::ReadOnceAndDrop the ranges unmapped behind the consumer are dropped from the page
// cache too (pages still mapped, a leased view's, stay: the kernel never drops a mapped page).
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
  struct Held {
    size_t item;
    c10::intrusive_ptr<c10::StorageImpl> storage;
  };
  // The last tensor, read into owned memory by a thread of its own.
  struct OwnedTail {
    size_t item = SIZE_MAX;  // SIZE_MAX: none (small, or a forked child)
    bool started = false;
    bool complete = false;  // written by the reader; read after joining it
    c10::DataPtr data;
    std::thread reader;
  };
  // Checks every held view (but the one handed out last, with `keep_last`); returns the first
  // change of a file met.
  std::optional<Error> release_held(bool keep_last) noexcept;
  // Keeps a held view as it is under its file's lease; false when there is no lease (refused,
  // or a writer came) or its file changed since open: the caller copies it then.
  bool keep_under_lease(const Held& held) noexcept;
  // `file`'s lease, taken on first need: a descriptor and a lease only for files with a view
  // kept past its step (a checkpoint of many shards would otherwise hold two descriptors per
  // shard). nullptr: refused, or no memory; asked once per file.
  io::FileLease* lease_of(size_t file) noexcept;
  // Copies a held view into owned memory; false when there was no memory for it (it stays a
  // view). `changed`: set when its file changed since open.
  bool make_owned(const Held& held, std::optional<Error>& changed) noexcept;
  // madvise(MADV_DONTNEED) over [begin, end) of `file`'s mapping, leased views' pages excepted;
  // with `drop_cache`, those pages dropped from the page cache too (posix_fadvise).
  void unmap_unleased(size_t file, uint64_t begin, uint64_t end, bool drop_cache = false) noexcept;
  // Not CacheUse::Keep: every file's mapping MADV_SEQUENTIAL and MADV_HUGEPAGE (2 MiB folios),
  // leased views' pages MADV_NORMAL (the default recency; their folios stay large).
  void advise_read_once() noexcept;
  // What the ranges unmapped (and dropped) behind the consumer end at multiples of (the file's
  // end excepted): the page, or read once the largest folio advise_read_once's mapping gets.
  uint64_t drop_unit() const noexcept;
  // Not CacheUse::Keep: the pages of the `length` bytes at `data` (a leased view's) MADV_NORMAL.
  void advise_kept(const uint8_t* data, uint64_t length) noexcept;
  // A view kept from an earlier pass, leased (so at the mapping's own address), shows some of
  // `item`'s bytes: a view of them now would share them with it.
  bool shown_by_a_leased_view(size_t item);
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
  std::unique_ptr<io::PageCacheReadAhead> read_ahead_;
  std::vector<uint64_t> position_of_item_;  // bytes of the items before it, in pass order
  std::deque<Held> held_;
  // Per file: nullopt until lease_of asks; then the lease, or nullptr where refused.
  std::vector<std::optional<std::shared_ptr<io::FileLease>>> leases_;
  LeasedViews leased_;
  bool leased_before_this_pass_ = false;  // a view of an earlier pass may share an item's bytes
  std::vector<uint64_t> dropped_up_to_;   // per file: pages before this offset are unmapped
  uint64_t window_;
  CacheUse cache_use_;
  uint64_t leased_view_min_bytes_;          // smaller kept views are copied (page_cache_views.cpp)
  std::vector<uint32_t> small_views_kept_;  // per file, before its lease was asked for
  size_t last_handed_out_ = SIZE_MAX;
  OwnedTail tail_;
};

}  // namespace instanttensor::loader

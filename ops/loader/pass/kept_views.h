// The views of a host pass that the consumer still holds when the pass moves on (next tensor, end
// of the pass, close, a new pass): this part alone decides, for each, whether its storage is
// still the loader's and whether to lease it, copy it or let it go. PageCacheViews hands views
// out and reads ahead; it asks this part what it may unmap behind the consumer.
#pragma once

#include <c10/core/StorageImpl.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "instanttensor/instanttensor.h"
#include "io/file_lease.h"
#include "io/mapped_files.h"
#include "loader/pass/leased_views.h"
#include "loader/pass/pass_state.h"

namespace instanttensor::loader {

// What a view's storage keeps alive: the mapping, and once it is kept under its file's lease,
// its protection. The storage's DataPtr owns it (its context); a lease attaches the protection
// here, so keeping a view never swaps the DataPtr of a storage the consumer holds.
struct ViewKeeper {
  std::shared_ptr<const io::MappedFiles> mapping;
  std::shared_ptr<io::ViewProtection> protection;  // set once, on the consumer's thread
};

// One view handed out: its storage, and the DataPtr the pass made for it. A storage is the
// loader's only while its DataPtr is still that one (its context, deleter and address): one that
// share_memory_, set_, pickling or anything else repointed is torch's then, and never touched.
struct HandedOutView {
  size_t item = 0;
  c10::intrusive_ptr<c10::StorageImpl> storage;
  std::shared_ptr<ViewKeeper> keeper;
  uint8_t* data = nullptr;        // the view's first byte in the mapping
  const void* context = nullptr;  // the DataPtr's context the pass made
  bool copy_failed = false;       // its copy found no memory once (reported then)
};

// A view kept past its step is:
// - let go when nobody else holds it, or when its storage was repointed (no longer ours);
// - kept as it is under a read lease on its file (io/file_lease.h) when it is 1 MiB or more, or
//   a file's second kept view (the lease is a descriptor; a single small one is copied), and the
//   kernel grants the lease, within io::FileLease::max_leases() files of the process at once
//   (a descriptor each: they stay bounded whatever the number of files; past it views are
//   copied);
// - where the lease is refused, a view of 1 MiB or more is copied where it is: its pages replaced
//   by private copies at the same addresses (io::FileLease::copying_at_once), so a numpy or
//   DLPack export taken during its step reads owned bytes too;
// - else copied into owned memory (the kernel's copy, never a SIGBUS if the file shrank) and its
//   storage repointed (set_data_ptr_noswap). A copy that finds no memory is Error(OutOfMemory)
//   naming the file and tensor, once: the view stays tracked apart (its pages mapped, so
//   neither an in-place write of it nor its bytes are lost), its copy is tried again at the
//   next steps, and the unmapping behind the consumer goes on past it.
// Consumer thread only (the loader's lock). A repoint by another thread racing a step (a
// multiprocessing Queue's feeder thread pickling a tensor while next() runs) is safe where the
// view is leased or copied where it is (nothing of the storage is written) but not where it is
// copied out: the README says so.
class KeptViews {
 public:
  // A kept view smaller than this is copied out rather than leased (or copied where it is): the
  // copy costs 0.1-0.3 ms at most, while a lease costs a descriptor of its own, and a process
  // whose descriptor table grows while it runs threads waits an RCU grace period. vLLM's loader
  // holds a view for a step past its own at each group of weights (itertools.groupby reads
  // ahead): in a tiny model of 12 shards, four leases of 128-256 KiB views crossed 64
  // descriptors, a 14 ms step of a 20-30 ms load.
  static constexpr uint64_t kLeasedViewMinBytes = 1ull << 20;
  // `plan` and `stats` outlive this part.
  KeptViews(const PassPlan& plan, std::shared_ptr<const io::MappedFiles> mapping, Stats& stats);
  ~KeptViews();
  KeptViews(const KeptViews&) = delete;
  KeptViews& operator=(const KeptViews&) = delete;

  // A new view of `item`'s bytes in the mapping (a non-empty tensor); not tracked until track().
  HandedOutView make_view(size_t item) const;
  // Tracks `view` (handed out now) until release() decides. Throws std::bad_alloc.
  void track(HandedOutView view);
  // Decides for every tracked view but `keep_item`'s (the last handed out, which a `for` loop
  // still binds; SIZE_MAX: all of them). Returns the first error met (a file changed since open,
  // or no memory for a copy); every view is decided whatever happens. Never throws.
  std::optional<Error> release(size_t keep_item) noexcept;
  // True when a view of `file` whose copy found no memory is still set aside: its descriptor
  // stays held (a retry checks the file through it, not its path).
  bool set_aside_in(size_t file) const noexcept;
  // The oldest item still tracked but those set aside; SIZE_MAX when none.
  size_t oldest_item() const noexcept;
  // True when `file` has, or is granted now, a lease (asked once per file).
  bool lease_available(size_t file) noexcept;
  // A view kept under a lease in an earlier pass shows some of `item`'s bytes.
  bool shown_by_a_leased_view(size_t item);
  // A new pass: views still held are decided, leased views that died since are forgotten.
  void begin_pass();
  // True when a leased view may be alive: leased since the last begin_pass(), or in an earlier
  // pass and alive then.
  bool any_leased() const noexcept { return leased_this_pass_ || leased_before_this_pass_; }
  // Calls `kept(first, last)` for the page ranges of `file` in [begin, end) that leased views
  // keep mapped, in order. Allocates nothing.
  template <typename Kept>
  void each_kept_page_range(size_t file, uint64_t begin, uint64_t end, Kept kept) {
    leased_.each_kept_page_range(file, begin, end, kept);
  }
  // In a forked child: no lease of its own (a file the parent never asked about has its views
  // copied out, as one the parent leased does: that lease answers the parent alone).
  void abandon_after_fork() noexcept;

 private:
  // True while `view`'s storage still carries the DataPtr the pass made.
  static bool still_ours(const HandedOutView& view) noexcept;
  // Lets `view` go, keeps it under a lease or copies it; false when its copy found no memory.
  // Its error, if any, goes to `first` unless one is there (no memory: only the first time).
  bool decide(const HandedOutView& view, std::optional<Error>& first) noexcept;
  // Sets aside `view`, whose copy found no memory: tracked in stuck_ and its pages kept mapped;
  // false when there is no memory for that either.
  bool stick(const HandedOutView& view) noexcept;
  // Keeps `view` under its file's lease, or, refused, copies a large one where it is (its
  // pages replaced by private copies: io::FileLease::copying_at_once); false when neither is to
  // be done or can be (make_owned then). `error`: set when the file changed during that copy.
  bool keep_under_lease(const HandedOutView& view, std::optional<Error>& error) noexcept;
  // Copies `view` into owned memory and repoints its storage; false when there was no memory
  // (it stays a view). `error`: set when its file changed since open or shrank (the missing
  // bytes are zeros then), or there was no memory.
  bool make_owned(const HandedOutView& view, std::optional<Error>& error) noexcept;
  io::FileLease* lease_of(size_t file) noexcept;
  io::FileLease* holder_of(size_t file) noexcept;  // where lease_of is nullptr

  const PassPlan& plan_;
  std::shared_ptr<const io::MappedFiles> mapping_;
  Stats& stats_;
  std::deque<HandedOutView> held_;
  std::deque<HandedOutView> stuck_;  // copies that found no memory: tried again at each step
  // Per file: nullopt until lease_of asks; then the lease, or nullptr where refused.
  std::vector<std::optional<std::shared_ptr<io::FileLease>>> leases_;
  std::vector<std::optional<std::shared_ptr<io::FileLease>>> holders_;  // copying_at_once
  LeasedViews leased_;
  std::vector<uint32_t> small_views_kept_;  // per file, before its lease was asked for
  uint64_t leased_view_min_bytes_;          // smaller kept views are copied
  bool leased_before_this_pass_ = false;    // a view of an earlier pass may share an item's bytes
  bool leased_this_pass_ = false;
};

}  // namespace instanttensor::loader

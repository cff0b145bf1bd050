#include "loader/pass/page_cache_views.h"

#include <ATen/Parallel.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "io/direct_io.h"
#include "io/thread_name.h"
#include "io/untouched_pages.h"
#include "loader/pass/owned_copy.h"
#include "loader/reads/timing.h"
#include "loader/transfer/storage_views.h"

namespace instanttensor::loader {

namespace {

// Where its file has no lease, a last tensor this large is read into owned memory beside the
// consumer rather than handed out as a view: the loop that asks for it still binds it at close,
// which would copy it then, on the consumer's time (the 262 MB lm_head of a 1 GB model: 0.12-0.4
// s of a 0.2 s warm load). Under a lease it stays a view like any kept one.
constexpr uint64_t kOwnedTailBytes = 1ull << 20;
// A kept view smaller than this is copied rather than leased: the copy costs 0.1-0.3 ms at most,
// while a lease costs a descriptor of its own, and a process whose descriptor table grows while
// it runs threads waits an RCU grace period. vLLM's loader holds a view for a step past its own
// at each group of weights (itertools.groupby reads ahead): in a tiny model of 12 shards, four
// leases of 128-256 KiB views crossed 64 descriptors, a 14 ms step of a 20-30 ms load.
constexpr uint64_t kLeasedViewMinBytes = 1ull << 20;

uint64_t leased_view_min_bytes() {
#ifdef INSTANTTENSOR_TESTING_HOOKS
  // Tests keep small views to exercise leases on small files.
  if (const char* testing = std::getenv("INSTANTTENSOR_TESTING_LEASE_MIN_BYTES")) {
    return std::strtoull(testing, nullptr, 10);
  }
#endif
  return kLeasedViewMinBytes;
}

}  // namespace

std::shared_ptr<const io::MappedFiles> map_for_views(const format::Checkpoint& checkpoint) {
  return std::make_shared<const io::MappedFiles>(checkpoint);
}

PageCacheViews::PageCacheViews(const PassPlan& plan, std::shared_ptr<const io::MappedFiles> mapping,
                               TensorFactory& factory, Stats& stats, uint64_t window,
                               io::ReadAheadPolicy read_ahead, CacheUse cache_use)
    : plan_(plan),
      factory_(factory),
      stats_(stats),
      mapping_(std::move(mapping)),
      leased_(plan.checkpoint->files().size()),
      window_(window),
      cache_use_(cache_use),
      leased_view_min_bytes_(leased_view_min_bytes()) {
  leases_.resize(plan_.checkpoint->files().size());
  small_views_kept_.resize(plan_.checkpoint->files().size());
  for (size_t item = 0; item < plan_.reads.items.size(); ++item) {
    const auto& t = plan_.tensor_of_item(item);
    if (t.nbytes > 0) tail_.item = t.nbytes >= kOwnedTailBytes ? item : SIZE_MAX;
  }
  // Under a lease the last view stays a view past the pass, like any kept one: no tail read.
  if (tail_.item != SIZE_MAX && lease_of(plan_.tensor_of_item(tail_.item).file_index)) {
    tail_.item = SIZE_MAX;
  }
  std::vector<io::MappedSpan> spans;
  uint64_t position = 0;
  for (size_t item = 0; item < plan_.reads.items.size(); ++item) {
    const auto& t = plan_.tensor_of_item(item);
    position_of_item_.push_back(position);
    position += t.nbytes;
    if (t.nbytes == 0 || item == tail_.item) continue;  // the tail is read by pread
    // Neighbouring tensors make one span: chunks then cut the file, not the tensors.
    if (!spans.empty() && spans.back().file == t.file_index && spans.back().end == t.file_offset) {
      spans.back().end += t.nbytes;
    } else {
      spans.push_back(io::MappedSpan{t.file_index, t.file_offset, t.file_offset + t.nbytes});
    }
  }
  dropped_up_to_.assign(plan_.checkpoint->files().size(), 0);
  read_ahead_ = std::make_unique<io::PageCacheReadAhead>(mapping_, spans, window, plan_.chunk_size,
                                                         read_ahead);
}

PageCacheViews::~PageCacheViews() {
  release_all();
  stop_tail();
}

void PageCacheViews::begin_pass() {
  release_all();
  stop_tail();
  last_handed_out_ = SIZE_MAX;
  std::fill(dropped_up_to_.begin(), dropped_up_to_.end(), 0);
  // Pages the last pass skipped for a leased view since dropped: an in-place write of it must
  // not reach this pass.
  leased_before_this_pass_ = leased_.forget_ended();
  for (size_t file = 0; file < dropped_up_to_.size(); ++file) {
    unmap_unleased(file, 0, mapping_->size(file));
  }
  advise_read_once();
  read_ahead_->restart();
}

std::optional<Error> PageCacheViews::settle(size_t item) noexcept {
  const bool ending = item >= plan_.reads.items.size();
  auto changed = release_held(/*keep_last=*/!ending);  // the loop still binds the last one
  drop_pages_behind(item);
  if (changed || ending) return changed;
  const auto& t = plan_.tensor_of_item(item);
  try {
    plan_.checkpoint->check_unchanged(t.file_index, t.name());
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

at::Tensor PageCacheViews::hand_out(size_t item) {
  if (auto changed = settle(item)) throw *changed;
  const auto& t = plan_.tensor_of_item(item);
  last_handed_out_ = item;
  read_ahead_->advance(position_of_item_[item]);
  // From the first step on: the read then overlaps the consumer's whole pass.
  if (tail_.item != SIZE_MAX && !tail_.started) start_tail_read();
  if (item == tail_.item) {
    if (auto owned = take_tail()) return *owned;
  }
  if (shown_by_a_leased_view(item)) return read_owned(item);
  // Held while a view of the file may be checked: a file deleted or truncated meanwhile is then
  // still measured (make_owned) and leased through the inode validated, not its path.
  (void)plan_.checkpoint->descriptor(t.file_index);
  auto spec = factory_.spec(t);
  auto storage = factory_.mapped(mapping_, t, 0, t.nbytes);
  stats_.bytes_read += t.nbytes;
  at::Tensor tensor = factory_.aligned(TensorFactory::over(storage, spec));
  // A misaligned tensor went out as an owned copy: nothing of the mapping to watch.
  if (tensor.storage().unsafeGetStorageImpl() == storage.get()) {
    held_.push_back(Held{item, std::move(storage)});
  }
  return tensor;
}

void PageCacheViews::pass_ended() {
  // Every view, the last one's included: without a lease a large last tensor was read owned
  // (the tail), so only a small one is copied here.
  if (auto changed = settle(plan_.reads.items.size())) throw *changed;
}

void PageCacheViews::release_all() noexcept {
  (void)release_held(/*keep_last=*/false);
  drop_pages_behind(plan_.reads.items.size());
}

void PageCacheViews::abandon_after_fork() {
  read_ahead_->abandon_after_fork();
  // No lease of the child's own: a file the parent never asked about keeps views copied out, as
  // one the parent leased does (its lease answers the parent alone).
  for (auto& lease : leases_) {
    if (!lease) lease = nullptr;
  }
  // The reader was the parent's thread: its handle is leaked, and the tail read as a view here.
  if (tail_.reader.joinable()) (void)new std::thread(std::move(tail_.reader));
  tail_ = OwnedTail{};
}

std::string PageCacheViews::description() const {
  return "views of the page cache (" + read_ahead_->description() +
         (cache_use_ == CacheUse::ReadOnce ? "; read once: MADV_SEQUENTIAL, MADV_HUGEPAGE)"
          : cache_use_ == CacheUse::ReadOnceAndDrop
              ? "; read once: MADV_SEQUENTIAL, MADV_HUGEPAGE, POSIX_FADV_DONTNEED behind)"
              : ")");
}

std::optional<Error> PageCacheViews::release_held(bool keep_last) noexcept {
  std::optional<Error> changed;
  while (!held_.empty() && !(keep_last && held_.front().item == last_handed_out_)) {
    Held held = std::move(held_.front());
    held_.pop_front();
    // Our reference is the only one left: the consumer dropped every view of it.
    if (held.storage.use_count() == 1) continue;
    if (keep_under_lease(held)) continue;
    std::optional<Error> error;
    const bool owned = make_owned(held, error);
    if (error && !changed) changed = std::move(error);
    if (!owned) {
      // Still a view (no memory for its copy): tracked again, and its pages stay mapped.
      held_.push_front(std::move(held));
      break;
    }
  }
  return changed;
}

bool PageCacheViews::make_owned(const Held& held, std::optional<Error>& changed) noexcept {
  auto start = Clock::now();
  const auto& t = plan_.tensor_of_item(held.item);
  const auto& file = plan_.checkpoint->files()[t.file_index];
  c10::StorageImpl& storage = *held.storage;
  const uint64_t nbytes = storage.nbytes();
  bool owned = false;
  try {
    plan_.checkpoint->check_unchanged(t.file_index, t.name());
  } catch (const Error& e) {
    changed.emplace(ErrorKind::Io, file.path, t.name(),
                    std::string("the file changed while the tensor was held as a view of it (") +
                        e.what() + ")");
  }
  // Touching mapped pages past the file's end raises SIGBUS: copy what the file still has.
  // (Its descriptor is held from hand_out until its views are checked: this is no reopen.)
  struct stat st {};
  uint64_t size_now = 0;
  try {
    format::ScopedDescriptor descriptor(*plan_.checkpoint, t.file_index);
    if (::fstat(descriptor.fd(), &st) == 0) size_now = static_cast<uint64_t>(st.st_size);
  } catch (const Error&) {
    // Never held (a bug) and no longer the file validated: nothing of it is safe to touch.
  }
  uint64_t available = size_now > t.file_offset ? std::min(nbytes, size_now - t.file_offset) : 0;
  try {
    // Fresh pages filled as they are allocated (io/untouched_pages.h), two threads at once: a
    // memcpy into fresh memory pays a zeroed page per 4 KiB first (262 MB: 0.24 s on one
    // thread, 0.12 s on two, in torch's own allocator). A small view (copied, not leased) goes
    // to the heap instead: a mapping and a userfaultfd of its own cost more than its bytes (100
    // load_file calls of 256 KB: 0.040 s against 0.0xx s).
    const bool small = nbytes < kLeasedViewMinBytes;
    std::shared_ptr<uint8_t> memory = small ? heap_bytes(nbytes) : io::map_untouched_pages(nbytes);
    uint8_t* to = memory.get();
    const auto* from = static_cast<const uint8_t*>(storage.data());
    if (small) {
      std::memcpy(to, from, available);
    } else {
      copy_into_untouched(to, from, available);
    }
    std::memset(to + available, 0, nbytes - available);
    // A pointer exported before (numpy, DLPack, data_ptr) still points into the mapping: it
    // stays mapped while the tensor lives, as the borrow ring keeps its block for such pointers.
    struct FreshKeepingTheMapping {
      std::shared_ptr<uint8_t> fresh;
      std::shared_ptr<const io::MappedFiles> mapping;
    };
    auto both = std::make_shared<FreshKeepingTheMapping>(
        FreshKeepingTheMapping{std::move(memory), mapping_});
    storage.set_data_ptr_noswap(data_kept_by(to, std::move(both)));
    stats_.materializations += 1;
    owned = true;
  } catch (...) {
    // No memory for it: the tensor stays a view of the mapping (valid while the file is), and
    // the caller keeps tracking it.
  }
  stats_.copy_seconds += seconds_since(start);
  return owned;
}

void PageCacheViews::drop_pages_behind(size_t next_item) noexcept {
  const size_t items = plan_.reads.items.size();
  size_t oldest = held_.empty() ? next_item : held_.front().item;
  size_t up_to_file = dropped_up_to_.size();
  uint64_t up_to_offset = 0;
  if (oldest < items) {
    const auto& t = plan_.tensor_of_item(oldest);
    up_to_file = t.file_index;
    const uint64_t unit = drop_unit();
    up_to_offset = t.file_offset / unit * unit;
  }
  // No worker maps a page behind the consumer again once it is unmapped (or dropped).
  read_ahead_->settle_before(oldest < items ? position_of_item_[oldest] : UINT64_MAX);
  auto drop = [&](size_t file, uint64_t end) {
    uint64_t& begin = dropped_up_to_[file];
    if (end <= begin) return;
    unmap_unleased(file, begin, end, cache_use_ == CacheUse::ReadOnceAndDrop);
    begin = end;
  };
  for (size_t file = 0; file < std::min(up_to_file, dropped_up_to_.size()); ++file) {
    if (dropped_up_to_[file] >= mapping_->size(file)) continue;  // behind since an earlier step
    drop(file, mapping_->size(file));
    release_descriptor(file);
  }
  if (up_to_file < dropped_up_to_.size()) drop(up_to_file, up_to_offset);
}

void PageCacheViews::release_descriptor(size_t file) noexcept {
  // The tail's reader reads through it until joined.
  if (tail_.reader.joinable() && plan_.tensor_of_item(tail_.item).file_index == file) return;
  plan_.checkpoint->release_descriptor(file);
}

void PageCacheViews::start_tail_read() noexcept {
  tail_.started = true;
  const auto& t = plan_.tensor_of_item(tail_.item);
  try {
    // Fresh pages filled as they are allocated, not zeroed first and then read into: the
    // kernel's page zeroing was most of this read's time (benchmarks/README.md).
    std::shared_ptr<uint8_t> memory = io::map_untouched_pages(t.nbytes);
    uint8_t* to = memory.get();
    tail_.data = data_kept_by(to, std::shared_ptr<const void>(std::move(memory)));
    const int fd = plan_.checkpoint->descriptor(t.file_index);
    // Buffered preads, never the mapping: a file truncated meanwhile is a short read here.
    tail_.reader = std::thread([this, fd, to, offset = t.file_offset, nbytes = t.nbytes] {
      io::name_this_thread("it-tail-read");
      auto read = io::read_into_untouched_pages(fd, offset, to, nbytes);
      tail_.complete = read.bytes == nbytes;
    });
  } catch (...) {
    tail_.data.clear();  // no memory or no thread: the view serves
  }
}

std::optional<at::Tensor> PageCacheViews::take_tail() {
  if (!tail_.started) start_tail_read();
  auto start = Clock::now();
  if (tail_.reader.joinable()) tail_.reader.join();
  stats_.wait_seconds += seconds_since(start);
  if (!tail_.complete) return std::nullopt;
  tail_.complete = false;
  return owned_tensor(tail_.item, std::move(tail_.data));
}

at::Tensor PageCacheViews::owned_tensor(size_t item, c10::DataPtr data) {
  const auto& t = plan_.tensor_of_item(item);
  // Bytes written in place while they were read: never handed out.
  plan_.checkpoint->check_unchanged(t.file_index, t.name());
  stats_.read_requests += 1;
  stats_.bytes_read += t.nbytes;
  return factory_.aligned(
      TensorFactory::over(make_storage(std::move(data), t.nbytes), factory_.spec(t)));
}

void PageCacheViews::stop_tail() noexcept {
  if (tail_.reader.joinable()) tail_.reader.join();
  tail_.started = tail_.complete = false;
  tail_.data.clear();
  // The pass had moved past the tail's file, or never reached it.
  if (tail_.item != SIZE_MAX && held_.empty()) {
    plan_.checkpoint->release_descriptor(plan_.tensor_of_item(tail_.item).file_index);
  }
}

}  // namespace instanttensor::loader

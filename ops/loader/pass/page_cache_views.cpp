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
      kept_(plan, mapping_, stats),
      window_(window),
      cache_use_(cache_use) {
  for (size_t item = 0; item < plan_.reads.items.size(); ++item) {
    const auto& t = plan_.tensor_of_item(item);
    if (t.nbytes > 0) tail_.item = t.nbytes >= kOwnedTailBytes ? item : SIZE_MAX;
  }
  // Under a lease the last view stays a view past the pass, like any kept one: no tail read.
  if (tail_.item != SIZE_MAX &&
      kept_.lease_available(plan_.tensor_of_item(tail_.item).file_index)) {
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
  kept_.begin_pass();
  for (size_t file = 0; file < dropped_up_to_.size(); ++file) {
    unmap_unleased(file, 0, mapping_->size(file));
  }
  advise_read_once();
  read_ahead_->restart();
}

std::optional<Error> PageCacheViews::settle(size_t item) noexcept {
  const bool ending = item >= plan_.reads.items.size();
  // The loop still binds the last one handed out.
  auto changed = kept_.release(ending ? SIZE_MAX : last_handed_out_);
  if (ending) advise_kept();
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
  if (kept_.shown_by_a_leased_view(item)) return read_owned(item);
  // Held while a view of the file may be kept: a file deleted or truncated meanwhile is then
  // still leased through the inode validated, not its path.
  (void)plan_.checkpoint->descriptor(t.file_index);
  auto spec = factory_.spec(t);
  HandedOutView view = kept_.make_view(item);
  stats_.bytes_read += t.nbytes;
  at::Tensor tensor = factory_.aligned(TensorFactory::over(view.storage, spec), t);
  // A misaligned tensor went out as an owned copy: nothing of the mapping to watch.
  if (tensor.storage().unsafeGetStorageImpl() == view.storage.get()) kept_.track(std::move(view));
  return tensor;
}

void PageCacheViews::pass_ended() {
  // Every view, the last one's included: without a lease a large last tensor was read owned
  // (the tail), so only a small one is copied here.
  if (auto changed = settle(plan_.reads.items.size())) throw *changed;
}

void PageCacheViews::release_all() noexcept {
  (void)kept_.release(SIZE_MAX);
  advise_kept();
  drop_pages_behind(plan_.reads.items.size());
}

void PageCacheViews::abandon_after_fork() {
  read_ahead_->abandon_after_fork();
  kept_.abandon_after_fork();
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

void PageCacheViews::drop_pages_behind(size_t next_item) noexcept {
  const size_t items = plan_.reads.items.size();
  size_t oldest = std::min(kept_.oldest_item(), next_item);
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
  // The tail's reader reads through it until joined; a view set aside is checked through it.
  if (tail_.reader.joinable() && plan_.tensor_of_item(tail_.item).file_index == file) return;
  if (kept_.set_aside_in(file)) return;
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
      TensorFactory::over(make_owned_storage(std::move(data), t.nbytes), factory_.spec(t)), t);
}

void PageCacheViews::stop_tail() noexcept {
  if (tail_.reader.joinable()) tail_.reader.join();
  tail_.started = tail_.complete = false;
  tail_.data.clear();
  // The pass had moved past the tail's file, or never reached it (but a view set aside there).
  if (tail_.item != SIZE_MAX && kept_.oldest_item() == SIZE_MAX) {
    release_descriptor(plan_.tensor_of_item(tail_.item).file_index);
  }
}

}  // namespace instanttensor::loader

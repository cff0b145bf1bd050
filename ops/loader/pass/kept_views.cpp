#include "loader/pass/kept_views.h"

#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "io/direct_io.h"
#include "loader/pass/owned_copy.h"
#include "loader/reads/timing.h"
#include "plan/read_plan.h"

namespace instanttensor::loader {

namespace {

uint64_t leased_view_min_bytes() {
#ifdef INSTANTTENSOR_TESTING_HOOKS
  // Tests keep small views to exercise leases on small files.
  if (const char* testing = std::getenv("INSTANTTENSOR_TESTING_LEASE_MIN_BYTES")) {
    return std::strtoull(testing, nullptr, 10);
  }
#endif
  return KeptViews::kLeasedViewMinBytes;
}

void release_keeper(void* context) { delete static_cast<std::shared_ptr<ViewKeeper>*>(context); }

}  // namespace

KeptViews::KeptViews(const PassPlan& plan, std::shared_ptr<const io::MappedFiles> mapping,
                     Stats& stats)
    : plan_(plan),
      mapping_(std::move(mapping)),
      stats_(stats),
      leases_(plan.checkpoint->files().size()),
      holders_(plan.checkpoint->files().size()),
      leased_(plan.checkpoint->files().size()),
      small_views_kept_(plan.checkpoint->files().size()),
      leased_view_min_bytes_(leased_view_min_bytes()) {}

KeptViews::~KeptViews() { (void)release(SIZE_MAX); }

HandedOutView KeptViews::make_view(size_t item) const {
  const auto& t = plan_.tensor_of_item(item);
  HandedOutView view;
  view.item = item;
  view.keeper = std::make_shared<ViewKeeper>(ViewKeeper{mapping_, nullptr});
  view.data = mapping_->data(t.file_index) + t.file_offset;
  auto* context = new std::shared_ptr<ViewKeeper>(view.keeper);
  view.context = context;
  // Resizable through torch's CPU allocator, as an owned tensor's storage is: resize_ then gives
  // it torch's memory (repointed: no longer ours).
  view.storage = c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), static_cast<int64_t>(t.nbytes),
      c10::DataPtr(view.data, context, &release_keeper, c10::Device(c10::DeviceType::CPU)),
      c10::GetCPUAllocator(), /*resizable=*/true);
  return view;
}

void KeptViews::track(HandedOutView view) { held_.push_back(std::move(view)); }

bool KeptViews::set_aside_in(size_t file) const noexcept {
  return std::any_of(stuck_.begin(), stuck_.end(), [&](const HandedOutView& view) {
    return plan_.tensor_of_item(view.item).file_index == file;
  });
}

size_t KeptViews::oldest_item() const noexcept {
  return held_.empty() ? SIZE_MAX : held_.front().item;
}

bool KeptViews::still_ours(const HandedOutView& view) noexcept {
  // The const accessor: it never materializes a copy-on-write storage.
  const c10::StorageImpl& storage = *view.storage;
  const c10::DataPtr& now = storage.data_ptr();
  return now.get_context() == view.context && now.get_deleter() == &release_keeper &&
         now.get() == view.data;
}

std::optional<Error> KeptViews::release(size_t keep_item) noexcept {
  std::optional<Error> first;
  // Views whose copy found no memory at an earlier step: tried again, before the rest.
  for (auto it = stuck_.begin(); it != stuck_.end();) {
    it = decide(*it, first) ? stuck_.erase(it) : std::next(it);
  }
  while (!held_.empty() && held_.front().item != keep_item) {
    HandedOutView view = std::move(held_.front());
    held_.pop_front();
    if (decide(view, first)) continue;
    view.copy_failed = true;
    if (!stick(view)) {
      // No memory to set it aside either: it stops the unmapping behind the consumer here,
      // tried again at the next step.
      held_.push_front(std::move(view));
      break;
    }
  }
  return first;
}

bool KeptViews::decide(const HandedOutView& view, std::optional<Error>& first) noexcept {
  // Our reference is the only one left: the consumer dropped every view of it. Or the storage
  // was repointed (share_memory_, set_, pickling): torch's now, never touched again.
  if (view.storage.use_count() == 1 || !still_ours(view)) return true;
  std::optional<Error> error;
  const bool done = keep_under_lease(view, error) || make_owned(view, error);
  const bool report = done || !view.copy_failed;  // no memory: said once
  if (error && report && !first) first = std::move(error);
  return done;
}

bool KeptViews::stick(const HandedOutView& view) noexcept {
  // Still a view: its pages stay mapped behind the consumer, as a leased view's do, and the
  // unmapping goes on past it. The index holds its keeper weakly (stuck_ and the storage's
  // DataPtr hold it): the entry expires once the view, let go or copied out, leaves stuck_.
  const auto& t = plan_.tensor_of_item(view.item);
  const uint64_t page = io::page_size();
  try {
    stuck_.push_back(view);
  } catch (...) {
    return false;
  }
  try {
    leased_.add(t.file_index, t.file_offset, t.nbytes, t.file_offset / page * page,
                plan::round_up(t.file_offset + t.nbytes, page), view.keeper);
  } catch (...) {
    stuck_.pop_back();
    return false;
  }
  leased_this_pass_ = true;  // a later pass reads its bytes into owned memory
  return true;
}

bool KeptViews::keep_under_lease(const HandedOutView& view, std::optional<Error>& error) noexcept {
  const auto& t = plan_.tensor_of_item(view.item);
  // A small view takes its file's lease (a descriptor) only once a second view of the file is
  // kept (load_file keeps them all), or when the lease is there already: a single one held for
  // a step past its own (vLLM's groupby reads ahead) is copied out.
  if (t.nbytes < leased_view_min_bytes_ && !leases_[t.file_index] &&
      ++small_views_kept_[t.file_index] < 2) {
    return false;
  }
  io::FileLease* lease = lease_of(t.file_index);
  // Refused, a large view is copied where it is (its pages replaced by private copies), so
  // that a pointer exported during its step reads owned bytes too; a small one is copied out.
  const bool at_once = !lease && t.nbytes >= kLeasedViewMinBytes;
  if (at_once) lease = holder_of(t.file_index);
  if (!lease) return false;
  const auto start = Clock::now();
  try {
    plan_.checkpoint->check_unchanged(t.file_index, t.name());
    uint8_t* mapped = mapping_->data(t.file_index);
    auto protection = lease->protect(mapped, static_cast<uint64_t>(view.data - mapped), t.nbytes);
    if (!protection) return false;
    leased_.add(t.file_index, t.file_offset, t.nbytes, protection);
    // The storage is not touched: its DataPtr's keeper holds the protection while it lives.
    view.keeper->protection = std::move(protection);
    leased_this_pass_ = true;
    if (!at_once) {
      stats_.leased_views += 1;
      return true;
    }
    stats_.materializations += 1;
    stats_.copy_seconds += seconds_since(start);
    // A change of the file during the copy is said as make_owned says it: the copy stays.
    plan_.checkpoint->check_unchanged(t.file_index, t.name());
    return true;
  } catch (const Error& e) {
    if (!view.keeper->protection) return false;  // changed since open: make_owned says so
    try {
      error.emplace(
          ErrorKind::Io, plan_.checkpoint->files()[t.file_index].path, t.name(),
          std::string("the file changed while the tensor was held as a view of it: ") + e.what());
    } catch (...) {
    }
    return true;
  } catch (...) {
    return false;  // no memory: make_owned says so
  }
}

io::FileLease* KeptViews::lease_of(size_t file) noexcept {
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

io::FileLease* KeptViews::holder_of(size_t file) noexcept {
  if (!holders_[file]) {
    try {
      // The copies filled as a view copied out is (owned_copy.h): torch's threads, no zeroing.
      holders_[file] =
          io::FileLease::copying_at_once(plan_.checkpoint->descriptor(file), &copy_into_untouched);
    } catch (...) {
      holders_[file] = nullptr;  // no memory, or the file is no longer the one validated
    }
  }
  return holders_[file]->get();
}

bool KeptViews::lease_available(size_t file) noexcept { return lease_of(file) != nullptr; }

bool KeptViews::shown_by_a_leased_view(size_t item) {
  if (!leased_before_this_pass_) return false;  // the first pass: no lookup per step
  const auto& t = plan_.tensor_of_item(item);
  return leased_.shows_bytes(t.file_index, t.file_offset, t.nbytes);
}

void KeptViews::begin_pass() {
  (void)release(SIZE_MAX);
  leased_this_pass_ = false;
  leased_before_this_pass_ = leased_.forget_ended();
}

void KeptViews::abandon_after_fork() noexcept {
  for (auto& lease : leases_) {
    if (!lease) lease = nullptr;
  }
  for (auto& holder : holders_) {
    if (!holder) holder = nullptr;  // a holder of the parent's copies nothing in a child
  }
}

}  // namespace instanttensor::loader

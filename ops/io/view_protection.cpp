// FileLease's protections of kept views (io/file_lease.h): listed under a lease until a
// writer comes, or copied where they are at once by a lease-less holder; and given back to the
// file's pages when they die.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <utility>
#include <vector>

#include "io/direct_io.h"
#include "io/file_lease.h"
#include "io/frozen_pages.h"
#include "io/lease_registry.h"
#include "io/process_id.h"

namespace instanttensor::io {

namespace {
uint64_t round_up(uint64_t value, uint64_t to) { return (value + to - 1) / to * to; }
}  // namespace

size_t FileLease::max_views_copied_at_once() noexcept {
#ifdef INSTANTTENSOR_TESTING_HOOKS
  // Tests reach the cap with a few views.
  if (const char* testing = std::getenv("INSTANTTENSOR_TESTING_VIEWS_COPIED_AT_ONCE_MAX")) {
    return std::strtoull(testing, nullptr, 10);
  }
#endif
  static const size_t cap = [] {
    uint64_t areas = 65530;  // the kernel's default
    if (FILE* file = std::fopen("/proc/sys/vm/max_map_count", "r")) {
      unsigned long long read = 0;
      if (std::fscanf(file, "%llu", &read) == 1 && read > 0) areas = read;
      std::fclose(file);
    }
    return static_cast<size_t>(areas / 8);
  }();
  return cap;
}

std::shared_ptr<FileLease> FileLease::copying_at_once(int fd, PageCopier copy) {
  install_fork_handlers();  // before the lock: pthread_atfork may allocate
  auto& registry = LeaseRegistry::get();
  std::lock_guard<std::mutex> lock(registry.mutex);
  if (registry.leases.size() >= max_leases()) return nullptr;
  // A duplicate is enough: no lease lives on it, it only maps the file's pages back.
  const int own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return nullptr;
  std::unique_ptr<FileLease> made;
  try {
    made.reset(new FileLease(own));
  } catch (...) {
    ::close(own);
    return nullptr;
  }
  made->held_ = false;  // nothing to release, nothing a break could ask
  try {
    // Its copies carved from a reservation of the file's size, at the views' own offsets.
    made->copies_ = std::make_unique<CopiesAtOnce>(copy, round_up(file_size_of(own), page_size()));
  } catch (...) {
    return nullptr;  // `made` closes its descriptor
  }
  return registry.add(std::move(made));
}

std::shared_ptr<ViewProtection> FileLease::protect(uint8_t* mapping_start, uint64_t offset,
                                                   uint64_t nbytes) {
  // Made before the lock: one that is never listed dies without taking it (after it, below).
  std::shared_ptr<ViewProtection> protection(
      new ViewProtection(shared_from_this(), mapping_start, offset, nbytes));
  auto& registry = LeaseRegistry::get();
  std::unique_lock<std::mutex> lock(registry.mutex);
  if (!(held_ || copies_) || taker_ != current_process_id()) return nullptr;
  if (copies_ && registry.views_copied_at_once >= max_views_copied_at_once()) {
    return nullptr;
  }
  // Doubling: reserving one more each time copied the whole list at every kept view.
  if (protections_.size() == protections_.capacity()) {
    protections_.reserve(std::max<size_t>(16, 2 * protections_.capacity()));
  }
  CopiesAtOnce::Replacement replacement;
  // A file shorter than the view (or one fstat cannot see) shrank since it was validated: the
  // caller's copy out says so.
  const uint64_t size = copies_ ? file_size_of(fd_) : 0;
  if (copies_ && (size < offset + nbytes ||
                  !copies_->prepare(protection->begin_, protection->end_, replacement))) {
    return nullptr;  // never listed: it dies without the lock
  }
  protection->index_ = protections_.size();
  protections_.push_back(protection.get());  // no throw: reserved
  protection->listed_ = true;
  if (!copies_) return protection;
  registry.views_copied_at_once += 1;
  // The copy without the lock: a fork, another file's lease break or a view dying on another
  // thread does not wait for it. Listed (not yet frozen), this view keeps a page it shares with
  // a neighbour dying meanwhile, and its range stays live.
  lock.unlock();
  const bool filled = copies_->fill(replacement, mapping_start, size);
  lock.lock();
  if (copies_->finish(replacement, mapping_start, filled)) {
    protection->frozen_ = true;
    return protection;
  }
  registry.views_copied_at_once -= 1;
  protection->unlist();
  return nullptr;
}

bool FileLease::freeze_all() noexcept {
  std::vector<ViewProtection*> open;
  for (ViewProtection* protection : protections_) {
    if (!protection->frozen_) open.push_back(protection);
  }
  std::sort(open.begin(), open.end(),
            [](const ViewProtection* a, const ViewProtection* b) { return a->begin_ < b->begin_; });
  const uint64_t size = file_size_of(fd_);
  bool all = true;
  // Neighbouring views make one replacement: one mapping each, not one per tensor
  // (vm.max_map_count is 65530 by default).
  for (size_t first = 0; first < open.size();) {
    uint8_t* start = open[first]->mapping_start_;
    uint64_t begin = open[first]->begin_;
    uint64_t end = open[first]->end_;
    size_t last = first + 1;
    while (last < open.size() && open[last]->begin_ <= end) end = std::max(end, open[last++]->end_);
    const bool done =
        replace_by_copies(start + begin, end - begin, size > begin ? size - begin : 0);
    for (size_t i = first; i < last; ++i) open[i]->frozen_ = done;
    all = all && done;
    first = last;
  }
  return all;
}

ViewProtection::ViewProtection(std::shared_ptr<FileLease> lease, uint8_t* mapping_start,
                               uint64_t offset, uint64_t nbytes)
    : lease_(std::move(lease)),
      mapping_start_(mapping_start),
      begin_(offset / page_size() * page_size()),
      end_(round_up(offset + nbytes, page_size())) {}

void ViewProtection::unlist() noexcept {
  // Its place taken by the last one: a view dying costs the same however many are kept.
  auto& list = lease_->protections_;
  list[index_] = list.back();
  list[index_]->index_ = index_;
  list.pop_back();
  listed_ = false;
}

ViewProtection::~ViewProtection() {
  if (!listed_) return;  // protect() gave it out to no one
  auto& registry = LeaseRegistry::get();
  std::lock_guard<std::mutex> lock(registry.mutex);
  unlist();
  auto& list = lease_->protections_;
  if (!frozen_) return;
  if (lease_->copies_) {
    registry.views_copied_at_once -= 1;
    lease_->copies_->dropped(begin_, end_);
  }
  // The file's pages again where no other kept view needs the copies: a later pass over the
  // same mapping must see the file, not these bytes (nor zeros once unmapped behind its
  // consumer). Kept views share no byte, so another can need only the first page or the last
  // (a page they share): nothing to allocate in a destructor.
  const uint64_t page = page_size();
  bool keep_first = false;
  bool keep_last = false;
  for (const ViewProtection* other : list) {
    keep_first = keep_first || (other->begin_ <= begin_ && begin_ < other->end_);
    keep_last = keep_last || (other->begin_ < end_ && end_ - page < other->end_);
  }
  const uint64_t from = begin_ + (keep_first ? page : 0);
  const uint64_t to = end_ - (keep_last && end_ - page >= from ? page : 0);
  if (to > from) restore_file_pages(mapping_start_, lease_->fd_, from, to - from);
}

}  // namespace instanttensor::io

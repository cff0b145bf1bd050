#include "io/file_lease.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "io/direct_io.h"
#include "io/frozen_pages.h"
#include "io/process_id.h"
#include "io/thread_name.h"

namespace instanttensor::io {

// Every lease of this process. Leaked on purpose: the watcher thread and the fork handlers use
// it until the process ends.
struct LeaseRegistry {
  std::mutex mutex;
  std::vector<FileLease*> leases;
  pid_t watcher_pid = 0;  // the process whose thread answers lease breaks; 0: none started
  pid_t watcher_tid = 0;
  int signal = 0;

  static LeaseRegistry& get() {
    static LeaseRegistry* registry = new LeaseRegistry;
    return *registry;
  }

  // Under `mutex`. Starts the watcher in this process once; false when no thread could start.
  bool start_watcher();
  // The watcher's loop: a lease signal names the descriptor whose lease a writer is breaking;
  // SIGIO (the signal's queue was full) names none, so every lease is asked.
  void watch(sigset_t set);
  // Under `mutex`: answers a break of `lease` if one is under way.
  static void answer(FileLease& lease);
  // Before a fork: the lock is taken until both processes go on, so the child never inherits it
  // held by the watcher. Nothing is copied (a fork costs what it costs without leases): the
  // parent's views stay under their leases; the child's share the parent's pages and, no lease
  // covering them, see a later rewrite of the file as safetensors' tensors do (README).
  static void lock_before_fork() { get().mutex.lock(); }
};

namespace {

// A real-time signal of glibc's range, chosen well inside it so that applications counting up
// from SIGRTMIN rarely meet it; it is only ever directed at the watcher thread, which blocks it.
int lease_signal() { return SIGRTMIN + 11; }

bool refused_for_testing() {
#ifdef INSTANTTENSOR_TESTING_HOOKS
  const char* value = std::getenv("INSTANTTENSOR_TESTING_NO_LEASE");
  return value && std::strcmp(value, "1") == 0;
#else
  return false;
#endif
}

void unlock_after_fork() { LeaseRegistry::get().mutex.unlock(); }

uint64_t round_up(uint64_t value, uint64_t to) { return (value + to - 1) / to * to; }

uint64_t size_of(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

}  // namespace

bool LeaseRegistry::start_watcher() {
  if (watcher_pid == current_process_id()) return true;
  signal = lease_signal();
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, signal);
  sigaddset(&set, SIGIO);
  // Blocked in the new thread from its first instruction: a break signalled before it waits
  // queued instead of taking the signal's default action (ending the process).
  sigset_t previous;
  if (pthread_sigmask(SIG_BLOCK, &set, &previous) != 0) return false;
  std::mutex started_mutex;
  std::condition_variable started;
  pid_t tid = 0;
  bool ok = true;
  try {
    std::thread([this, set, &started_mutex, &started, &tid] {
      name_this_thread("it-lease-watch");
      {
        std::lock_guard<std::mutex> lock(started_mutex);
        tid = static_cast<pid_t>(::syscall(SYS_gettid));
        started.notify_one();  // under the lock: the waiter may return and destroy both
      }
      watch(set);
    }).detach();
    std::unique_lock<std::mutex> lock(started_mutex);
    started.wait(lock, [&] { return tid != 0; });
  } catch (...) {
    ok = false;
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (!ok) return false;
  static std::once_flag fork_handlers;
  std::call_once(fork_handlers, [] {
    pthread_atfork(LeaseRegistry::lock_before_fork, unlock_after_fork, unlock_after_fork);
  });
  watcher_pid = current_process_id();
  watcher_tid = tid;
  return true;
}

void LeaseRegistry::answer(FileLease& lease) {
  // Only a lease being broken reads as anything but F_RDLCK: a stale signal (a descriptor
  // released, maybe reused since) changes nothing.
  if (!lease.held_ || lease.taker_ != current_process_id() ||
      ::fcntl(lease.fd_, F_GETLEASE) == F_RDLCK) {
    return;
  }
  if (!lease.freeze_all()) return;  // kept: the kernel lets the writer go after its timeout
  ::fcntl(lease.fd_, F_SETLEASE, F_UNLCK);
  lease.held_ = false;
}

void LeaseRegistry::watch(sigset_t set) {
  for (;;) {
    siginfo_t info{};
    const int got = sigwaitinfo(&set, &info);
    if (got < 0) continue;
    std::lock_guard<std::mutex> lock(mutex);
    for (FileLease* lease : leases) {
      if (got == SIGIO || lease->fd_ == info.si_fd) answer(*lease);
    }
  }
}

size_t FileLease::max_leases() noexcept {
  rlimit limit{};
  const bool known = ::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY;
  return std::max<size_t>(1, std::min<size_t>(64, (known ? limit.rlim_cur : 1024) / 16));
}

std::shared_ptr<FileLease> FileLease::take(int fd) {
  if (refused_for_testing()) return nullptr;
  auto& registry = LeaseRegistry::get();
  std::lock_guard<std::mutex> lock(registry.mutex);
  // A descriptor each: past the cap, views are copied and the process keeps its descriptors.
  if (registry.leases.size() >= max_leases()) return nullptr;
  if (!registry.start_watcher()) return nullptr;
  // A description of our own: F_SETSIG and F_SETOWN_EX are set on it, and its lease is ours.
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  const int own = ::open(self.c_str(), O_RDONLY | O_CLOEXEC);
  if (own < 0) return nullptr;
  f_owner_ex owner{F_OWNER_TID, registry.watcher_tid};
  if (::fcntl(own, F_SETSIG, registry.signal) != 0 || ::fcntl(own, F_SETOWN_EX, &owner) != 0 ||
      ::fcntl(own, F_SETLEASE, F_RDLCK) != 0) {
    ::close(own);
    return nullptr;
  }
  std::unique_ptr<FileLease> made;
  try {
    made.reset(new FileLease(own));
  } catch (...) {
    ::close(own);  // the lease ends with its description
    return nullptr;
  }
  try {
    registry.leases.reserve(registry.leases.size() + 1);
    std::shared_ptr<FileLease> lease(std::move(made));
    registry.leases.push_back(lease.get());
    lease->registered_ = true;
    return lease;
  } catch (...) {
    return nullptr;  // `made`, not registered, closes its descriptor without the lock
  }
}

FileLease::FileLease(int own_fd) : fd_(own_fd), taker_(current_process_id()) {}

FileLease::~FileLease() {
  auto& registry = LeaseRegistry::get();
  if (registered_) {
    std::lock_guard<std::mutex> lock(registry.mutex);
    registry.leases.erase(std::remove(registry.leases.begin(), registry.leases.end(), this),
                          registry.leases.end());
    // A forked child shares the open file description: unlocking would end the parent's lease.
    if (held_ && taker_ == current_process_id()) ::fcntl(fd_, F_SETLEASE, F_UNLCK);
  }
  ::close(fd_);
}

std::shared_ptr<ViewProtection> FileLease::protect(uint8_t* mapping_start, uint64_t offset,
                                                   uint64_t nbytes) {
  // Made before the lock: one that is never listed dies without taking it (after it, below).
  std::shared_ptr<ViewProtection> protection(
      new ViewProtection(shared_from_this(), mapping_start, offset, nbytes));
  auto& registry = LeaseRegistry::get();
  std::lock_guard<std::mutex> lock(registry.mutex);
  if (!held_ || taker_ != current_process_id()) return nullptr;
  // Doubling: reserving one more each time copied the whole list at every kept view.
  if (protections_.size() == protections_.capacity()) {
    protections_.reserve(std::max<size_t>(16, 2 * protections_.capacity()));
  }
  protection->index_ = protections_.size();
  protections_.push_back(protection.get());  // no throw: reserved
  protection->listed_ = true;
  return protection;
}

bool FileLease::freeze_all() noexcept {
  std::vector<ViewProtection*> open;
  for (ViewProtection* protection : protections_) {
    if (!protection->frozen_) open.push_back(protection);
  }
  std::sort(open.begin(), open.end(),
            [](const ViewProtection* a, const ViewProtection* b) { return a->begin_ < b->begin_; });
  const uint64_t size = size_of(fd_);
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

ViewProtection::~ViewProtection() {
  if (!listed_) return;  // protect() gave it out to no one
  auto& registry = LeaseRegistry::get();
  std::lock_guard<std::mutex> lock(registry.mutex);
  auto& list = lease_->protections_;
  // Its place taken by the last one: a view dying costs the same however many are kept.
  list[index_] = list.back();
  list[index_]->index_ = index_;
  list.pop_back();
  if (!frozen_) return;
  // The file's pages again where no other kept view needs the copies: a later pass over the
  // same mapping must see the file, not these bytes (nor zeros once unmapped behind its
  // consumer).
  std::vector<std::pair<uint64_t, uint64_t>> keep;
  for (ViewProtection* other : list) {
    if (other->begin_ < end_ && begin_ < other->end_) keep.emplace_back(other->begin_, other->end_);
  }
  std::sort(keep.begin(), keep.end());
  auto remap = [&](uint64_t begin, uint64_t end) {
    if (end > begin) restore_file_pages(mapping_start_, lease_->fd_, begin, end - begin);
  };
  uint64_t from = begin_;
  for (auto [begin, end] : keep) {
    remap(from, std::min(begin, end_));
    from = std::max(from, end);
  }
  remap(from, end_);
}

}  // namespace instanttensor::io

#include "io/file_lease.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "io/direct_io.h"

namespace instanttensor::io {

// Every lease of this process, by the descriptor the watcher is told about. Leaked on purpose:
// the watcher thread and fork handlers use it until the process ends.
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

  FileLease* find(int fd) {
    for (FileLease* lease : leases) {
      if (lease->fd_ == fd) return lease;
    }
    return nullptr;
  }

  // Under `mutex`. Starts the watcher in this process once; false when no thread could start.
  bool start_watcher();
  // The watcher's loop: each signal names the descriptor whose lease a writer is breaking.
  void watch(sigset_t set);
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

void lock_for_fork() { LeaseRegistry::get().mutex.lock(); }
void unlock_after_fork() { LeaseRegistry::get().mutex.unlock(); }
void child_after_fork() {
  LeaseRegistry::get().mutex.unlock();
  FileLease::freeze_all_in_child();
}

uint64_t round_up(uint64_t value, uint64_t to) { return (value + to - 1) / to * to; }

}  // namespace

bool LeaseRegistry::start_watcher() {
  if (watcher_pid == ::getpid()) return true;
  signal = lease_signal();
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, signal);
  // Blocked in the new thread from its first instruction: a lease break that arrived before it
  // waits queued instead of taking the signal's default action (ending the process).
  sigset_t previous;
  if (pthread_sigmask(SIG_BLOCK, &set, &previous) != 0) return false;
  std::mutex started_mutex;
  std::condition_variable started;
  pid_t tid = 0;
  bool ok = true;
  try {
    std::thread([this, set, &started_mutex, &started, &tid] {
      {
        std::lock_guard<std::mutex> lock(started_mutex);
        tid = static_cast<pid_t>(::syscall(SYS_gettid));
      }
      started.notify_one();
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
  std::call_once(fork_handlers,
                 [] { pthread_atfork(lock_for_fork, unlock_after_fork, child_after_fork); });
  watcher_pid = ::getpid();
  watcher_tid = tid;
  return true;
}

void LeaseRegistry::watch(sigset_t set) {
  for (;;) {
    siginfo_t info{};
    if (sigwaitinfo(&set, &info) < 0) continue;
    std::lock_guard<std::mutex> lock(mutex);
    FileLease* lease = find(info.si_fd);
    // A stale signal for a descriptor released (and maybe reused) since: only a lease being
    // broken reads as anything but F_RDLCK.
    if (!lease || !lease->held_ || ::fcntl(lease->fd_, F_GETLEASE) == F_RDLCK) continue;
    lease->break_now();
  }
}

std::shared_ptr<FileLease> FileLease::take(int fd) {
  if (refused_for_testing()) return nullptr;
  auto& registry = LeaseRegistry::get();
  std::lock_guard<std::mutex> lock(registry.mutex);
  if (!registry.start_watcher()) return nullptr;
  const int own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return nullptr;
  f_owner_ex owner{F_OWNER_TID, registry.watcher_tid};
  if (::fcntl(own, F_SETSIG, registry.signal) != 0 || ::fcntl(own, F_SETOWN_EX, &owner) != 0 ||
      ::fcntl(own, F_SETLEASE, F_RDLCK) != 0) {
    ::close(own);
    return nullptr;
  }
  std::shared_ptr<FileLease> lease(new FileLease(own));
  registry.leases.push_back(lease.get());
  return lease;
}

FileLease::FileLease(int own_fd) : fd_(own_fd), taker_(::getpid()) {}

FileLease::~FileLease() {
  auto& registry = LeaseRegistry::get();
  {
    std::lock_guard<std::mutex> lock(registry.mutex);
    registry.leases.erase(std::remove(registry.leases.begin(), registry.leases.end(), this),
                          registry.leases.end());
    // A forked child shares the open file description: unlocking would end the parent's lease.
    if (held_ && taker_ == ::getpid()) ::fcntl(fd_, F_SETLEASE, F_UNLCK);
  }
  ::close(fd_);
}

std::shared_ptr<ViewProtection> FileLease::protect(uint8_t* mapping_start, uint64_t offset,
                                                   uint64_t nbytes) {
  auto& registry = LeaseRegistry::get();
  std::lock_guard<std::mutex> lock(registry.mutex);
  if (!held_ || taker_ != ::getpid()) return nullptr;
  const uint64_t page = page_size();
  std::shared_ptr<ViewProtection> protection(new ViewProtection(
      shared_from_this(), mapping_start, offset / page * page, round_up(offset + nbytes, page)));
  protections_.push_back(protection.get());
  return protection;
}

void FileLease::break_now() noexcept {
  struct stat st {};
  const uint64_t size = ::fstat(fd_, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  for (ViewProtection* protection : protections_) protection->freeze(size);
  ::fcntl(fd_, F_SETLEASE, F_UNLCK);
  held_ = false;
}

void FileLease::freeze_all_in_child() noexcept {
  auto& registry = LeaseRegistry::get();
  std::lock_guard<std::mutex> lock(registry.mutex);
  for (FileLease* lease : registry.leases) {
    struct stat st {};
    const uint64_t size = ::fstat(lease->fd_, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
    for (ViewProtection* protection : lease->protections_) protection->freeze(size);
  }
}

ViewProtection::ViewProtection(std::shared_ptr<FileLease> lease, uint8_t* mapping_start,
                               uint64_t begin, uint64_t end)
    : lease_(std::move(lease)), mapping_start_(mapping_start), begin_(begin), end_(end) {}

bool ViewProtection::frozen() const {
  std::lock_guard<std::mutex> lock(LeaseRegistry::get().mutex);
  return frozen_;
}

void ViewProtection::freeze(uint64_t file_size) noexcept {
  if (frozen_) return;
  const uint64_t length = end_ - begin_;
  void* fresh = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (fresh == MAP_FAILED) return;  // no memory: the view stays a view of the file
  // Pages past a file's end raise SIGBUS: a file shrunk by a writer that did not wait for the
  // lease (one that had it open before) leaves zeros there.
  const uint64_t available = file_size > begin_ ? std::min(length, file_size - begin_) : 0;
  std::memcpy(fresh, mapping_start_ + begin_, available);
  // Over the same addresses in one step: a reader sees the file's page or its copy, never a hole.
  if (::mremap(fresh, length, length, MREMAP_MAYMOVE | MREMAP_FIXED, mapping_start_ + begin_) ==
      MAP_FAILED) {
    ::munmap(fresh, length);
    return;
  }
  frozen_ = true;
}

ViewProtection::~ViewProtection() {
  auto& registry = LeaseRegistry::get();
  std::lock_guard<std::mutex> lock(registry.mutex);
  auto& list = lease_->protections_;
  list.erase(std::remove(list.begin(), list.end(), this), list.end());
  if (!frozen_) return;
  // The file's pages again where no other kept view needs the copies: a later pass over the same
  // mapping must see the file, not these bytes (nor zeros once unmapped behind its consumer).
  std::vector<std::pair<uint64_t, uint64_t>> keep;
  for (ViewProtection* other : list) {
    if (other->frozen_ && other->begin_ < end_ && begin_ < other->end_) {
      keep.emplace_back(other->begin_, other->end_);
    }
  }
  std::sort(keep.begin(), keep.end());
  uint64_t from = begin_;
  auto remap = [&](uint64_t begin, uint64_t end) {
    if (end <= begin) return;
    ::mmap(mapping_start_ + begin, end - begin, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED,
           lease_->fd_, static_cast<off_t>(begin));
  };
  for (auto [begin, end] : keep) {
    remap(from, std::min(begin, end_));
    from = std::max(from, end);
  }
  remap(from, end_);
}

}  // namespace instanttensor::io

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
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "io/direct_io.h"
#include "io/lease_registry.h"
#include "io/process_id.h"
#include "io/thread_name.h"

namespace instanttensor::io {

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

}  // namespace

void install_fork_handlers() {
  static std::once_flag installed;
  std::call_once(installed, [] {
    pthread_atfork(LeaseRegistry::lock_before_fork, unlock_after_fork, unlock_after_fork);
  });
}

uint64_t file_size_of(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

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
  install_fork_handlers();
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
  return registry.add(std::move(made));
}

std::shared_ptr<FileLease> LeaseRegistry::add(std::unique_ptr<FileLease> made) noexcept {
  try {
    leases.reserve(leases.size() + 1);
    std::shared_ptr<FileLease> lease(std::move(made));
    leases.push_back(lease.get());
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

}  // namespace instanttensor::io

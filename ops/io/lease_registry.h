// The process's registry of read leases and lease-less holders (io/file_lease.h): one lock for
// every lease, its protections and the watcher thread; shared by file_lease.cpp (leases, the
// watcher) and view_protection.cpp (protections, holders). Internal to io/.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "io/file_lease.h"

namespace instanttensor::io {

// Every lease of this process. Leaked on purpose: the watcher thread and the fork handlers use
// it until the process ends.
struct LeaseRegistry {
  std::mutex mutex;
  std::vector<FileLease*> leases;
  pid_t watcher_pid = 0;  // the process whose thread answers lease breaks; 0: none started
  pid_t watcher_tid = 0;
  int signal = 0;
  size_t views_copied_at_once = 0;  // frozen by copying_at_once() holders, alive

  static LeaseRegistry& get() {
    static LeaseRegistry* registry = new LeaseRegistry;
    return *registry;
  }

  // Under `mutex`: lists `made` (a lease, or a holder copying at once) and hands it out; nullptr
  // when there is no memory (`made` then closes its descriptor; unregistered, it takes no lock).
  std::shared_ptr<FileLease> add(std::unique_ptr<FileLease> made) noexcept;
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

// Once per process, by the first lease or holder: the fork handlers that keep a child from
// inheriting the registry's lock held by a thread that is not there (its kept views'
// protections take it when they die). Any thread, without the lock.
void install_fork_handlers();

// The size of the file `fd` reads; 0 when fstat fails. Any thread.
uint64_t file_size_of(int fd);

}  // namespace instanttensor::io

// What a loader does when the process that opened it forks: the child has the parent's memory
// but none of its threads.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <mutex>
#include <string>

#include "instanttensor/error.h"

namespace instanttensor::loader {

// A mutex that a forked child can still lock. A thread of the parent that held it at the fork
// does not exist in the child, so it would stay locked forever: the first lock in a new process
// starts from a fresh mutex instead (the child has one thread at that point; the state the
// mutex guarded is then left behind by the caller, see ProcessOwner).
class ForkSafeMutex {
 public:
  ForkSafeMutex();
  ForkSafeMutex(const ForkSafeMutex&) = delete;
  ForkSafeMutex& operator=(const ForkSafeMutex&) = delete;
  // Any thread; blocks like std::mutex::lock.
  std::unique_lock<std::mutex> lock() const;

 private:
  mutable std::mutex mutex_;
  mutable std::atomic<pid_t> owner_pid_;
};

// The process that opened a loader and the process whose threads own its reads now.
class ProcessOwner {
 public:
  ProcessOwner();
  // True once in each new process (a forked child, a grandchild, ...), the first time it asks:
  // the caller then drops what the previous process's threads owned, without waiting for them.
  // Under the loader's lock.
  bool entered_new_process();
  // This process is not the one that opened the loader.
  bool forked() const;
  // Error(Argument) for `what`, which cannot work in a forked child: names the file, both
  // processes, and says to open the checkpoint again in this process.
  Error refusal(const std::string& file, const std::string& what) const;

 private:
  pid_t opener_;
  pid_t current_;
};

}  // namespace instanttensor::loader

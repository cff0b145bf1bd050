#include "loader/fork_safety.h"

#include <unistd.h>

#include <new>

#include "io/process_id.h"

namespace instanttensor::loader {

using io::current_process_id;

ForkSafeMutex::ForkSafeMutex() : owner_pid_(current_process_id()) {}

std::unique_lock<std::mutex> ForkSafeMutex::lock() const {
  pid_t self = current_process_id();
  pid_t seen = owner_pid_.load();
  if (seen != self && owner_pid_.compare_exchange_strong(seen, self)) {
    // The parent's copy may be locked by a thread that is gone: a fresh one over it. Its old
    // state is memory only (no thread waits on it in this process), so nothing is destroyed.
    new (&mutex_) std::mutex();
  }
  return std::unique_lock<std::mutex>(mutex_);
}

ProcessOwner::ProcessOwner() : opener_(current_process_id()), current_(opener_) {}

bool ProcessOwner::entered_new_process() {
  pid_t self = current_process_id();
  if (self == current_) return false;
  current_ = self;
  return true;
}

bool ProcessOwner::forked() const { return current_process_id() != opener_; }

Error ProcessOwner::refusal(const std::string& file, const std::string& what) const {
  return Error(ErrorKind::Argument, file, "",
               what + " cannot be used in a forked child (the checkpoint was opened in process " +
                   std::to_string(opener_) + ", this is process " +
                   std::to_string(current_process_id()) +
                   ": the parent's read threads, borrowed buffers, pinned and device memory do "
                   "not carry over); open the checkpoint again in this process");
}

}  // namespace instanttensor::loader

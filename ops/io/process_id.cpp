#include "io/process_id.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>

namespace instanttensor::io {

namespace {

std::atomic<pid_t> cached_id{0};

void refresh() noexcept { cached_id.store(::getpid(), std::memory_order_relaxed); }

// At library load, before any thread of ours exists and before any fork it could miss.
const bool registered = [] {
  refresh();
  return ::pthread_atfork(nullptr, nullptr, refresh) == 0;
}();

}  // namespace

pid_t current_process_id() noexcept {
  // Where the handler could not be registered (no memory at load), ask the kernel each time.
  if (!registered) return ::getpid();
  return cached_id.load(std::memory_order_relaxed);
}

}  // namespace instanttensor::io

// Names for the threads the loader starts, so that top -H, gdb, py-spy and
// /proc/<pid>/task/*/comm tell them from the application's (they would all read "python3").
#pragma once

#include <pthread.h>

#include <thread>

namespace instanttensor::io {

// Names the calling thread `name` (at most 15 characters, the kernel's limit). Best effort: a
// refusal leaves the name it inherited. Call first in each thread the loader starts.
inline void name_this_thread(const char* name) noexcept {
  (void)pthread_setname_np(pthread_self(), name);
}

// Names `thread` from the thread that started it: named once this returns, where a thread
// naming itself may not have run yet when its starter looks (a test counting workers).
inline void name_thread(std::thread& thread, const char* name) noexcept {
  (void)pthread_setname_np(thread.native_handle(), name);
}

}  // namespace instanttensor::io

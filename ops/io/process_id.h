// This process's id without a system call: the loader asks it on every lock and step to notice a
// fork, and glibc's getpid() is a system call each time (32 of about 70 per small load_file).
#pragma once

#include <sys/types.h>

namespace instanttensor::io {

// The calling process's id. Any thread; never blocks. Refreshed in a forked child by a
// pthread_atfork handler before fork() returns there, so it is right after fork(), os.fork()
// and multiprocessing's fork. A child made by a raw clone(2) that runs no fork handlers (not
// glibc's fork, posix_spawn or vfork followed by exec) would read its parent's id.
pid_t current_process_id() noexcept;

}  // namespace instanttensor::io

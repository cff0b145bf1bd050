// The one submit/complete interface every read backend implements, torch-free.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace instanttensor::io {

// Read `length` bytes at `offset` of `fd` into `dest`. The caller keeps `dest` (and the fd)
// valid until the matching completion has been returned by wait_completion().
// A file as the io layer sees it before choosing how to read it.
struct FileToRead {
  std::string path;
  int buffered_fd = -1;  // owned by the caller
  uint64_t size = 0;
};

struct ReadRequest {
  int fd = -1;
  uint64_t offset = 0;
  uint64_t length = 0;
  void* dest = nullptr;
  uint64_t tag = 0;  // returned untouched in the completion
  // Bytes that must arrive (0: all of `length`). An O_DIRECT read rounded up past the end of
  // the file legally stops early at EOF; only EOF before `required` is a truncated file.
  uint64_t required = 0;
  size_t file = 0;  // the caller's label of the file read, returned untouched in the completion
};

// Bytes of `request` that must arrive before end of file.
inline uint64_t required_bytes(const ReadRequest& request) {
  return request.required ? request.required : request.length;
}

struct ReadCompletion {
  uint64_t tag = 0;
  size_t file = 0;         // the request's, returned untouched
  int error = 0;           // errno of a failed read; 0 on success
  bool truncated = false;  // end of file came before `length` bytes: the file shrank
  uint64_t bytes = 0;      // bytes read
  double seconds = 0;      // time spent in the read calls
  // When the last read call returned (a worker's clock: the consumer may learn of it later).
  std::chrono::steady_clock::time_point finished{};
};

class ReadBackend {
 public:
  virtual ~ReadBackend() = default;
  // Queues a request; never blocks on I/O. Called from one thread (the consumer's).
  virtual void submit(const ReadRequest& request) = 0;
  // Blocks until some submitted request finished and returns it; only valid while
  // in_flight() > 0. Same thread as submit().
  virtual ReadCompletion wait_completion() = 0;
  // Requests submitted and not yet returned by wait_completion().
  virtual size_t in_flight() const = 0;
  // Idle spells the workers spun before sleeping, so far (make_pread_pool's idle_spin_us): what
  // a test of when workers spin counts, as CPU time cannot on a busy host. Any thread.
  virtual uint64_t idle_spells_spun() const { return 0; }
};

// An io_uring ring of `depth` entries, driven from the consumer's thread: reads complete in the
// kernel (truly asynchronous with O_DIRECT fds); short reads are resubmitted for the rest.
// Throws Error(Io) when io_uring is unavailable (EPERM under seccomp, ENOSYS, ENOMEM), so the
// caller can fall back. Only built with liburing; otherwise always throws.
std::unique_ptr<ReadBackend> make_uring_backend(unsigned depth);

// A pool of `threads` workers doing blocking pread calls (buffered I/O), retrying EINTR and
// EAGAIN and continuing after short reads. Destruction waits for queued requests to finish and
// joins the workers. A worker that finds no request queued keeps its core for up to
// `idle_spin_us` microseconds (yielding it to any other runnable thread) before it sleeps, as
// long as its idle spells stay shorter than that: reads that are memory copies, queued a slice
// at a time, are then picked up at once instead of after a wake-up, and a worker that idles
// for longer spells sleeps through them (plan::choose_worker_spin_us says when).
std::unique_ptr<ReadBackend> make_pread_pool(int threads, uint32_t idle_spin_us = 0);

// Serves each request on the caller's thread inside submit() (completions are returned in
// order by wait_completion): for small checkpoints, where starting and joining workers costs
// more than the reads.
std::unique_ptr<ReadBackend> make_inline_reader(
    std::function<ReadCompletion(const ReadRequest&)> perform);

// One blocking pread of `request` (retrying EINTR/EAGAIN, continuing after short reads): what
// a pread pool worker does. Any thread.
ReadCompletion pread_request(const ReadRequest& request);

// The pool behind make_pread_pool with another way to serve a request (`perform` runs on the
// workers, several at once, and must only write into the request's memory).
std::unique_ptr<ReadBackend> make_worker_pool(
    int threads, std::function<ReadCompletion(const ReadRequest&)> perform,
    uint32_t idle_spin_us = 0);

}  // namespace instanttensor::io

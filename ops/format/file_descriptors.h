// The descriptors of a checkpoint's files: opened when a reader needs one, each checked to be the
// file validated at open, and closed again once released, so that a pass over many shards never
// holds one descriptor per shard at once (the views pass holds the files of its last views; the
// read path the files whose reads are in flight, and the file read last). Torch-free.
//
// Why: a process whose descriptor table grows (past 64, 256, ...) while it runs several threads
// waits an RCU grace period inside the kernel. vLLM's worker holds about 57 descriptors when it
// loads: twelve shards held at once crossed 64 and cost 10-30 ms, a tiny model's whole load
// (benchmarks/README.md). safetensors holds one file at a time.
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "format/checkpoint_file.h"

namespace instanttensor::format {

class FileDescriptors {
 public:
  // Over `files` (a vector that outlives this; read by index, so it may still grow while the
  // files are validated).
  explicit FileDescriptors(const std::vector<CheckpointFile>& files);
  ~FileDescriptors();
  FileDescriptors(const FileDescriptors&) = delete;
  FileDescriptors& operator=(const FileDescriptors&) = delete;

  // Takes over `fd`, the descriptor file `index` was validated through, as idle (see below).
  void adopt(size_t index, int fd);

  // A descriptor of file `index`, in use until release(index): the one in use already, or an
  // idle one kept from an earlier use, or one opened now by the file's path. Unless it was in
  // use already, the path is checked to still name the file validated, unchanged (device,
  // inode, size, modification time): otherwise Error(Io) naming the file (replaced by rename,
  // rewritten, deleted), and the file is never read. Once in use, a replacement by rename no longer
  // reaches the reads (they go to the inode validated). Owned here: callers never close it. Use is
  // a flag, not a count: acquire and release on one thread (the loader's consumer, under its lock);
  // the descriptor may be read through from any thread meanwhile.
  int acquire(size_t index);
  // File `index` is no longer read through its descriptor (the caller knows no read through it
  // is in flight or will start; its number may name another file afterwards). It stays open,
  // idle, while no more than kOpenKept descriptors are open in all, so that a small checkpoint
  // opens each file once. The thread that acquires.
  void release(size_t index);
  bool in_use(size_t index) const;
  // Closes every descriptor. A later acquire opens again (checked). Idempotent; any thread.
  void close_all();

  // How file `index` is now: an fstat of its descriptor in use, else a stat of its path; in the
  // latter case Error(Io) naming the file and `tensor` when the path names another file or
  // none, or cannot be stat'ed (throw_reopen_failed). Any thread.
  struct stat stat_now(size_t index, const std::string& tensor) const;

  // Descriptors kept open, in use and idle together (more are open only while in use): a one-
  // or two-file checkpoint opens each file once in all, and a pass over views of many shards
  // holds the shards of its last two tensors. vLLM's worker holds 61 descriptors when it loads:
  // a third and a fourth of ours crossed 64 (a 15-22 ms step of a 20-40 ms load).
  static constexpr size_t kOpenKept = 2;

 private:
  // Closes idle descriptors, oldest first, while more than kOpenKept are open. Under mutex_.
  void trim_idle();

  const std::vector<CheckpointFile>& files_;
  mutable std::mutex mutex_;
  std::vector<int> fds_;      // per file; -1: closed
  std::vector<bool> in_use_;  // per file: acquired and not released
  size_t in_use_count_ = 0;
  std::deque<size_t> idle_;  // files with an open descriptor not in use, oldest first
};

}  // namespace instanttensor::format

// Choosing how to read a checkpoint's files: probing, then the fallback chain (torch-free).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "format/checkpoint.h"
#include "io/mapped_files.h"
#include "io/read_backend.h"

namespace instanttensor::io {

// The decision for one open checkpoint. Owns the O_DIRECT fds it opens, each while reads of its
// file are in flight (release).
class IoSetup {
 public:
  // Walks `backend_names` (lower-case, preferred first) and settles on the first usable one:
  //   auto           -> buffered reads when the files are mostly in the page cache (mincore),
  //                     else as choose_cold_read_method decides (buffered until then);
  //   pread|buffered -> buffered pread pool;   direct -> O_DIRECT pread pool;
  //   uring          -> io_uring on O_DIRECT;  uring_buffered -> io_uring, buffered;
  //   mmap           -> each file mapped once (MappedFiles); reads copy from the mapping, and
  //                     the loader hands out views of it where it can. Never chosen by auto.
  //                     A file that cannot be mapped: the next name is tried.
  // O_DIRECT falls back to buffered per file when the filesystem refuses it (tmpfs). Never
  // throws for an unavailable backend: the end of the chain is the buffered pread pool.
  IoSetup(const std::vector<std::string>& backend_names, const std::vector<FileToRead>& files);
  // The same over `checkpoint`'s files, whose buffered descriptors stay the checkpoint's: opened
  // when a read first needs them (Checkpoint::descriptor) and in use until release(); one at a
  // time while setting up, so that a setup reading nothing through them (views of the page
  // cache) holds none of its own. The checkpoint outlives this.
  IoSetup(const std::vector<std::string>& backend_names, const format::Checkpoint& checkpoint);
  ~IoSetup();
  IoSetup(const IoSetup&) = delete;
  IoSetup& operator=(const IoSetup&) = delete;

  // `auto` on files mostly out of the page cache: with `time_them`, O_DIRECT and buffered reads
  // are timed on the first bytes of the load (measure_read_methods) and the faster one kept;
  // without (the iteration reads through the page cache anyway), buffered. The choice and the
  // rates go into description(). Call before start_backend and before reading alignment();
  // nothing for any other backend or for cached files; once. Consumer thread.
  void choose_cold_read_method(bool time_them);

  // The fd reads of file `index` go to (its O_DIRECT one, else buffered_fd), open until
  // release(index). The O_DIRECT one is opened on first need and checked to be the file
  // validated (device, inode, size, modification time). Throws Error naming the file when it
  // has to be opened again and is no longer the file validated ("changed since it was opened
  // (how)"), or cannot be opened (Io; without a checkpoint, the kind follows errno). Consumer
  // thread.
  int read_fd(size_t index) const;
  // Whether file `index` is read through an O_DIRECT descriptor.
  bool reads_direct(size_t index) const { return direct_[index]; }
  // Whether file `index`'s buffered descriptor is in use (by any reader of the checkpoint; true
  // for a caller's own descriptor, which is never released here).
  bool buffered_in_use(size_t index) const;
  // No read of file `index` is in flight or queued: its O_DIRECT descriptor is closed and, with
  // `buffered`, its buffered one released to the checkpoint (which keeps a few open idle).
  // Consumer thread.
  void release(size_t index, bool buffered);
  // Reads start and end on multiples of this, and land on addresses aligned to it (1: any).
  uint64_t alignment() const { return alignment_; }
  bool direct() const { return alignment_ > 1; }
  // Whether at least half of the files' bytes were in the page cache at construction (reads
  // then copy memory; else they wait on the storage).
  bool mostly_resident() const { return mostly_resident_; }
  // The mapping of every file when the mmap backend was chosen, else nullptr.
  const std::shared_ptr<const MappedFiles>& mapping() const { return mapping_; }
  // The buffered fd of file `index` (reads that O_DIRECT cannot take: unaligned destinations):
  // the caller's, or the checkpoint's (opened now if not held; throws as read_fd).
  int buffered_fd(size_t index) const;

  // Starts the backend the chain chose: io_uring when asked for and available, else the pread
  // pool (or the mapping's copy pool) of `threads` workers, idle ones spinning up to
  // `idle_spin_us` before they sleep; threads == 0 reads inline on the consumer's thread (small
  // checkpoints; io_uring, when asked for, is kept). Consumer thread; call once.
  std::unique_ptr<ReadBackend> start_backend(int threads, int depth, uint32_t idle_spin_us = 0);
  // Reads the backend start_backend(threads, depth) gives runs at once: io_uring's depth, else
  // the workers (1 inline).
  int reads_at_once(int threads, int depth) const;
  // "pread", "pread+O_DIRECT", "io_uring+O_DIRECT", ... and why a fallback happened, if any.
  std::string description() const { return description_ + note_; }
  // Appends " (note)" to the description: why the loader chose this setup. Consumer thread.
  void add_note(const std::string& note) {
    note_ += " (";  // appended: GCC 12's -Wrestrict misfires on `" (" + note` in C++20
    note_ += note;
    note_ += ')';
  }

  // Closes the fds opened here and drops this reference to the mapping. Idempotent.
  void close();

 private:
  // The constructors' common part, after files_ (and checkpoint_) are set.
  void set_up(const std::vector<std::string>& backend_names);
  // Every file whose filesystem takes O_DIRECT is read so from now on (each opened once to
  // learn its alignment, then closed: read_fd opens it again when a read needs it).
  void read_direct();
  // File `index` opened O_DIRECT now, checked against the checkpoint's identity of it.
  int open_direct_again(size_t index) const;
  // The description from the choices so far: "pread+O_DIRECT (1 file(s) buffered: ...)".
  void describe();

  std::vector<FileToRead> files_;  // buffered_fd -1 where the checkpoint holds the descriptors
  const format::Checkpoint* checkpoint_ = nullptr;
  std::vector<bool> direct_;             // per file: read through O_DIRECT
  mutable std::vector<int> direct_fds_;  // per file; -1: not open now
  std::shared_ptr<const MappedFiles> mapping_;
  uint64_t alignment_ = 1;
  bool uring_ = false;
  bool mostly_resident_ = false;
  bool cold_method_undecided_ = false;
  int direct_refused_ = 0;
  std::string skipped_;         // backends of the chain that could not be used, and why
  std::string uring_fallback_;  // why io_uring could not start (the pread pool reads instead)
  std::string description_;
  std::string note_;
};

}  // namespace instanttensor::io

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

// The decision for one open checkpoint. Owns the O_DIRECT fds it opened.
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
  // when a read first needs them (Checkpoint::descriptor) and kept in use until close; one at a
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

  // The fd reads of file `index` go to (its O_DIRECT one, else buffered_fd). Throws Error(Io)
  // naming the file when it has to be opened again and is no longer the file validated.
  int read_fd(size_t index) const;
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
  // pool (or the mapping's copy pool) of `threads` workers; threads == 0 reads inline on the
  // consumer's thread (small checkpoints; io_uring, when asked for, is kept). Consumer thread;
  // call once.
  std::unique_ptr<ReadBackend> start_backend(int threads, int depth);
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
  // Opens every file O_DIRECT where the filesystem allows it: their reads go there.
  void read_direct();
  // The description from the choices so far: "pread+O_DIRECT (1 file(s) buffered: ...)".
  void describe();

  std::vector<FileToRead> files_;  // buffered_fd -1 where the checkpoint holds the descriptors
  const format::Checkpoint* checkpoint_ = nullptr;
  std::vector<int> direct_fds_;  // per file; -1: read buffered
  std::shared_ptr<const MappedFiles> mapping_;
  std::vector<int> owned_fds_;
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

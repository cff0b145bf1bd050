// Scheduling reads for one loader: submissions by tag, completions booked per tag, draining.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>

#include "instanttensor/error.h"
#include "instanttensor/instanttensor.h"
#include "io/io_setup.h"
#include "io/read_backend.h"
#include "loader/reads/pass_timeline.h"
#include "plan/read_plan.h"

namespace instanttensor::loader {

// Why a tag's reads failed: the errno of the first failed read, or a short read (the file
// shrank). The loader turns it into an Error naming the file and the tensor.
struct ReadFailure {
  int error = 0;
  bool truncated = false;
};

// The Error a failed read of tensor `name` in `file` raises: the errno's kind and text, or a
// short read (the file shrank).
Error read_failure_error(const ReadFailure& failure, const std::string& file,
                         const std::string& name);

// Owns the read backend (started on the first submission, so opening a checkpoint only to list
// its keys costs no threads). Every read carries a tag (a read group, a unit slice, a random
// access); the scheduler counts the pieces in flight per tag and keeps the first failure of
// each. Consumer thread only; the backend's workers only write into the memory of the requests.
class ReadScheduler {
 public:
  // `io` outlives the scheduler; `stats` receives bytes, requests and read time. Idle workers
  // spin up to `idle_spin_us` before they sleep (io::make_pread_pool).
  ReadScheduler(io::IoSetup& io, int threads, int depth, uint64_t chunk_size, Stats& stats,
                uint32_t idle_spin_us = 0);
  ~ReadScheduler();

  // Submits `range` of file `file_index` in pieces of at most chunk_size, landing at `dest`
  // (which must stay valid until the tag is done). `buffered`: through the file's buffered fd
  // even when the checkpoint is read with O_DIRECT (ranges and memory that are not aligned).
  // Returns the number of pieces. Throws what the backend throws (it could not start, or
  // refuses after a failure): the tag then waits only for the pieces already queued.
  size_t submit(size_t file_index, const plan::AlignedRange& range, uint8_t* dest, uint64_t tag,
                bool buffered = false);
  // Blocks for one completion and books it. Precondition: in_flight() > 0.
  void wait_one();
  // Every piece submitted under `tag` has completed (true for a tag never submitted).
  bool done(uint64_t tag) const;
  // Every piece of `tag` completed without a failure, and the tag is still tracked (submitted,
  // not forgotten): its bytes are in place. False for a tag unknown or forgotten.
  bool succeeded(uint64_t tag) const;
  // The first failure among the completed pieces of `tag`, if any.
  std::optional<ReadFailure> failure(uint64_t tag) const;
  // The smallest tag with a failed read not yet forgotten, if any.
  std::optional<uint64_t> first_failed_tag() const;
  // Drops the bookkeeping of a done tag.
  void forget(uint64_t tag);
  // Blocks until every piece of `tag` has completed (booking the other tags' completions on the
  // way), forgets the tag and returns its first failure, if any. Throws the backend's error
  // when its wait fails (the tag is then left to settle() or drain()), and Error(Internal) for
  // a tag still pending with nothing in flight (a broken count, never a wait without end).
  std::optional<ReadFailure> wait_for(uint64_t tag);
  // For a caller unwinding an error whose memory `tag`'s reads write into: waits until none of
  // them can still land (a backend whose wait throws has none left in the kernel; the one
  // exception, io_uring refusing the wait itself, leaves nothing to wait with), books the
  // other tags' completions on the way and forgets `tag`. Never throws, so it may run in a
  // destructor or a catch block before the memory is freed.
  void settle(uint64_t tag) noexcept;
  // Waits for every read in flight (their memory may then be reused) and forgets every tag.
  // A backend that cannot complete its reads (its wait throws, once none is left in the kernel)
  // stops the wait there.
  void drain() noexcept;
  size_t in_flight() const { return backend_ ? backend_->in_flight() : 0; }
  // Reads the backend runs at once (its workers, or io_uring's depth): fewer in flight leaves
  // the storage waiting.
  size_t reads_at_once() const { return static_cast<size_t>(io_.reads_at_once(threads_, depth_)); }
  // The loader's timeline: held here because every stage that reads or waits holds the
  // scheduler. Off until enabled; kept after stop().
  PassTimeline& timeline() { return timeline_; }
  const PassTimeline& timeline() const { return timeline_; }
  // The descriptors of a file the scheduler read are held until this (or drain): released if no
  // piece of file `file` (release_idle_files: of any file) is in flight. Callers release a file
  // once they have checked its reads (check_unchanged goes by the descriptor while it is held,
  // so a shard replaced by rename after its reads began still passes): the read pass when the
  // consumer moves past the file, random access and load_into at the end of each call, which
  // then hold nothing between calls, where the views pass may acquire the same files.
  void release_if_idle(size_t file) noexcept;
  void release_idle_files() noexcept;
  // Joins the workers. Call after drain().
  void stop() { backend_.reset(); }
  // In a forked child: the backend's workers were the parent's threads and are gone, so its
  // object is leaked on purpose (destroying it would join them) and every tag is forgotten. The
  // next submit starts a backend of this process.
  void abandon_after_fork() {
    (void)backend_.release();
    tags_.clear();
    failed_.clear();
    files_.clear();
  }

 private:
  struct TagState {
    size_t pending = 0;
    std::optional<ReadFailure> failure;
  };
  // A file whose descriptors this scheduler holds: pieces in flight or queued, and whether its
  // buffered descriptor was acquired here from nobody's use (then released here; one another
  // reader holds, the views pass or the cold probe, is left in use).
  struct FileReads {
    bool held = false;
    size_t pieces = 0;
    bool release_buffered = false;
  };
  io::ReadBackend& backend();
  // Books one finished piece of file `file`.
  void piece_done(size_t file);
  // Closes or releases the file's descriptors (IoSetup::release) and forgets them.
  void release_file(size_t file) noexcept;

  io::IoSetup& io_;
  int threads_;
  int depth_;
  uint32_t idle_spin_us_;
  uint64_t chunk_size_;
  Stats& stats_;
  std::unique_ptr<io::ReadBackend> backend_;
  std::unordered_map<uint64_t, TagState> tags_;
  std::set<uint64_t> failed_;
  std::vector<FileReads> files_;  // by file index, grown on submit
  PassTimeline timeline_;
};

}  // namespace instanttensor::loader

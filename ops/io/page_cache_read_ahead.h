// Bringing a mapped checkpoint's next bytes into memory ahead of a consumer that reads them
// through the mapping (torch-free).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "io/mapped_files.h"

namespace instanttensor::io {

// A run of bytes of one mapped file, in the order the consumer reads them.
struct MappedSpan {
  size_t file = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// How the workers bring pages in (ReadAheadPolicy::method). PopulateRead, refused by the kernel
// (EINVAL), turns into WillNeed for the rest of the read-ahead's life.
enum class PopulateMethod {
  PopulateRead,  // madvise(MADV_POPULATE_READ), Linux 5.14+: reads and maps, no fault later
  WillNeed,      // madvise(MADV_WILLNEED): starts the read into the page cache; the consumer's
                 // first touch still maps each page
};

// Who brings a pass's next pages in.
struct ReadAheadPolicy {
  int workers = 0;  // threads populating the window ahead of the consumer (0: none)
  // Without workers: the consumer's thread advises MADV_WILLNEED over the window as it advances.
  // The storage then fetches every file of a small cold checkpoint at once, where the
  // consumer's page faults would fetch them one after another (12 shards of 220 KB: the pass
  // 8.5 -> 5 ms). Advice returns before the reads complete; pages in the cache make it cheap.
  bool advise_inline = false;
  // How the workers bring pages in. PopulateRead falls back to WillNeed on a kernel without it.
  PopulateMethod method = PopulateMethod::PopulateRead;
};

// Workers that populate the pages of `spans` (cut into chunks of about `chunk` bytes) up to
// `window` bytes past the consumer's position, in order, several chunks at once, so the storage
// works while the consumer copies and the consumer takes no page fault that waits on it.
// Population is advice: a slice that fails (a file truncated since it was mapped answers
// EFAULT) is skipped, never raised; the consumer meets the file as it is. Workers never touch
// mapped bytes themselves (a truncated file cannot raise SIGBUS on them).
//
// Nothing is populated before the first advance() or restart(): an open used only for random
// access maps nothing. Threads: advance(), restart() and the destructor are the consumer's (one
// thread at a time); the workers only call madvise. No workers (none asked, or no thread to be
// had) populates nothing, the consumer faulting pages in, unless `advise_inline` is asked.
class PageCacheReadAhead {
 public:
  // Bytes a worker populates between two looks at the consumer's floor (a multiple of any page
  // size): what settle_before may wait for, and how far a slice may run behind the consumer.
  static constexpr uint64_t kPopulateSlice = 2ull << 20;

  PageCacheReadAhead(std::shared_ptr<const MappedFiles> files, const std::vector<MappedSpan>& spans,
                     uint64_t window, uint64_t chunk, ReadAheadPolicy policy);
  // Stops the workers after the slice each is populating, and joins them.
  ~PageCacheReadAhead();
  PageCacheReadAhead(const PageCacheReadAhead&) = delete;
  PageCacheReadAhead& operator=(const PageCacheReadAhead&) = delete;

  // The consumer now reads at `position` (bytes of the spans before it, in order): workers may
  // populate chunks that start before position + window; with `advise_inline`, this call
  // advises them itself (madvise on the caller's thread, returning before the reads end).
  // Positions only grow within a pass.
  void advance(uint64_t position);
  // A new pass: population (or advice) starts again from the first chunk (resident pages cost
  // little).
  void restart();
  // The consumer is about to unmap what lies before the page of `position` (bytes of the
  // spans): nothing before that page is populated once this returns. Chunks are populated in
  // slices of at most kPopulateSlice bytes, each trimmed to that page when taken; a slice being
  // populated that starts before `position` is waited for (pages the consumer passed are
  // cached, so that populate only maps them; the wait is one slice at most). Without it, a
  // worker slower than a consumer that faulted its pages itself maps them again after the
  // unmap: resident again, and cached after a drop. Consumer's thread; no-op without workers,
  // after a fork, or when `position` is not above the last call's (no slice started since is
  // behind it).
  void settle_before(uint64_t position) noexcept;
  // In a forked child: the workers were the parent's; nothing is joined, nothing more populated.
  void abandon_after_fork();

  PopulateMethod method() const { return method_.load(); }
  // "MADV_POPULATE_READ, 4 workers" or the like, for stats()["backend"].
  std::string description() const;
  // Returns once every worker waits with nothing it may populate (within the window, past the
  // floor): a point the caller controls, after which the counts below stay as they are until it
  // calls advance(), restart() or settle_before() again. Not after a fork. Any thread.
  void wait_until_idle();
  uint64_t chunks_populated() const { return chunks_populated_.load(); }
  uint64_t bytes_populated() const { return bytes_populated_.load(); }

 private:
  struct Chunk {
    uint8_t* data;  // page-aligned
    uint64_t length;
    uint64_t position;  // of its first byte among the spans
    uint64_t skipped;   // bytes before that first byte, from `data` (less than a page)
    // The position just past its last byte.
    uint64_t end_position() const { return position + length - skipped; }
    // Starts `bytes` later: at least `skipped`, at most `length`.
    void drop_front(uint64_t bytes) {
      data += bytes;
      length -= bytes;
      position += bytes - skipped;
      skipped = 0;
    }
  };
  void work();
  // Populates (or advises) one slice of a chunk; whether the kernel took it. A worker's.
  bool populate(const Chunk& slice);
  // Under mutex_: trims `chunk` to start at the page of floor_'s byte; false when it lies wholly
  // before floor_ (nothing of it may be populated).
  bool clip_to_floor(Chunk& chunk) const;
  // Under mutex_: skips the chunks the consumer has passed, and those wholly before floor_;
  // whether the next chunk starts within the window ahead of the consumer.
  bool next_chunk_within_window();
  // advise_inline: MADV_WILLNEED over the chunks within the window not advised yet. Consumer.
  void advise_window();

  std::shared_ptr<const MappedFiles> files_;
  std::vector<Chunk> chunks_;
  uint64_t window_;
  int thread_count_;
  bool advise_inline_;
  // On the heap: a forked child leaks both, since the parent's workers were waiting on them at
  // the fork (destroying the condition variable there waits for those waiters forever).
  std::unique_ptr<std::mutex> mutex_ = std::make_unique<std::mutex>();
  std::unique_ptr<std::condition_variable> wake_ = std::make_unique<std::condition_variable>();
  std::unique_ptr<std::condition_variable> populated_ = std::make_unique<std::condition_variable>();
  std::vector<uint64_t> in_flight_;  // guarded by mutex_: positions of slices being populated
  uint64_t floor_ = 0;               // guarded by mutex_: nothing before its page is populated
  uint64_t settled_floor_ = 0;       // the consumer's: the last settle_before's position
  size_t next_chunk_ = 0;            // guarded by mutex_
  uint64_t position_ = 0;            // guarded by mutex_
  bool stopping_ = false;            // guarded by mutex_
  int idle_workers_ = 0;             // guarded by mutex_: waiting with nothing to populate
  bool active_ = false;  // guarded by mutex_: a pass began (nothing is populated before)
  std::atomic<PopulateMethod> method_;
  std::atomic<uint64_t> chunks_populated_{0};
  std::atomic<uint64_t> bytes_populated_{0};
  std::vector<std::thread> workers_;
  bool abandoned_ = false;
};

}  // namespace instanttensor::io

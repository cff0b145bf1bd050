// The host policy of a pass over views of the page cache: who brings the pages in, how, and what
// becomes of the page cache behind the consumer. Chosen once at open by a pure function, so the
// decision is one table (tests/cpp/test_host_policy.cpp) instead of branches in the loader.
// Torch-free.
#pragma once

#include <cstdint>

namespace instanttensor::plan {

// What a pass does with the page cache behind its consumer.
enum class CacheUse {
  // The kernel's recency: a checkpoint that fits keeps its pages cached for the next load.
  Keep,
  // A checkpoint larger than half of memory, which cannot stay cached beside the weights loaded
  // from it: its mappings are advised MADV_SEQUENTIAL (and MADV_HUGEPAGE), so the pages unmapped
  // behind the consumer leave the cache before the rest of it (a working set the system uses).
  ReadOnce,
  // ReadOnce, for a checkpoint larger than memory with no other process of the launch on this
  // host: the pages behind the consumer are also dropped from the page cache
  // (POSIX_FADV_DONTNEED), so the kernel's reclaim never has to find them. Not with ranks on this
  // host, which may not have read them yet; not for a smaller checkpoint, whose pages a next
  // load may find.
  ReadOnceAndDrop,
};

struct HostPolicyInputs {
  uint64_t selected_bytes = 0;  // the bytes the pass reads
  uint64_t memory_bytes = 0;    // the machine's memory, or its cgroup's limit if lower
  bool mostly_cached = false;   // the files are (mostly) in the page cache already
  bool alone_on_host = true;    // no other rank or launcher process on this host
  int concurrency = 0;          // the caller's explicit worker count (0: choose)
};

struct HostPolicy {
  int workers = 0;             // read-ahead threads populating the window
  bool advise_inline = false;  // no workers: the consumer's thread advises MADV_WILLNEED
  bool advise = false;         // workers advise (MADV_WILLNEED) rather than populate
  CacheUse cache_use = CacheUse::Keep;
};

// Any thread; pure. The reasons and the figures behind each threshold: host_policy.cpp.
HostPolicy choose_host_policy(const HostPolicyInputs& in);

// The read path's worker count (a pass that reads into loader memory: a named backend, an
// accelerator, the exchange).
struct ReadThreadInputs {
  uint64_t selected_bytes = 0;
  bool direct = false;         // O_DIRECT reads, which wait on the storage
  bool mostly_cached = false;  // buffered reads of files in the page cache: memory copies
  bool exchanging = false;     // ranks exchange bytes (their walks need the workers)
  int concurrency = 0;         // the caller's explicit count (0: choose)
  int cores = 0;               // online cores (0: unknown)
};

// Any thread; pure.
int choose_read_threads(const ReadThreadInputs& in);

// How long an idle read worker keeps its core before it sleeps.
struct WorkerSpinInputs {
  bool staged = false;         // reads into a staging ring, queued a slice at a time as it frees
  bool mostly_cached = false;  // buffered reads of files in the page cache: memory copies
  bool alone = true;           // no other process loading on this host, no ranks in step
  bool within_cores = true;    // no more workers than the host has cores
};

// Microseconds (0: sleep at once). Any thread; pure. The figures behind it: host_policy.cpp.
uint32_t choose_worker_spin_us(const WorkerSpinInputs& in);

// The read size of a pass that reads into a staging ring (a device target, or staging forced).
struct StagedReadInputs {
  uint64_t requested = 0;         // the caller's chunk_size (0: none asked)
  bool mostly_cached = false;     // buffered reads of files in the page cache: memory copies
  bool alone = true;              // no ranks planning their reads alike (in step, exchanging)
  int reads_at_once = 0;          // the reads the backend runs at once
  int processes_on_host = 1;      // loads sharing this host's cache (a launcher's count)
  uint64_t last_level_cache = 0;  // bytes (0: unknown)
};

// Any thread; pure. What it chooses and the figures behind it: host_policy.cpp.
uint64_t choose_staged_read_bytes(const StagedReadInputs& in);

// How load_file goes through one file it has opened: each tensor read into memory of its own on
// the caller's thread (random access: no pass, no view kept to make owned or lease at the end,
// so nothing of the file stays open or mapped afterwards), or one pass of the loader (on the
// host, views of the page cache: the bytes never copied).
enum class LoadFilePath { EachTensorRead, OnePass };

struct LoadFileInputs {
  uint64_t selected_bytes = 0;  // the file's tensor bytes
  uint64_t tensors = 0;         // how many tensors it has
  bool host_target = true;      // the tensors go to the CPU
  // Random access hands out views of the file mapping (the mmap backend): not owned memory.
  bool random_access_maps = false;
};

// Any thread; pure. The thresholds and the figures behind them: host_policy.cpp.
LoadFilePath choose_load_file_path(const LoadFileInputs& in);

}  // namespace instanttensor::plan

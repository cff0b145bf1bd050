#include "plan/host_policy.h"

#include <algorithm>

#include "plan/defaults.h"
#include "plan/memory_plan.h"

namespace instanttensor::plan {

HostPolicy choose_host_policy(const HostPolicyInputs& in) {
  HostPolicy policy;
  policy.workers = in.concurrency ? in.concurrency : defaults::kConcurrency;
  if (!in.concurrency) {
    // Small checkpoints: starting workers costs more than the reads; the consumer's thread
    // only advises the kernel to fetch them, every file at once, if they are not cached.
    if (in.selected_bytes <= defaults::kInlineReadBytes) {
      policy.workers = 0;
      policy.advise_inline = true;
    }
    // Files in the page cache: populating maps pages the consumer's own faults map as fast
    // (16 at a time), and on few cores the workers take the consumer's time (1 GB warm:
    // 0.35-0.5 s with 2-4 workers against 0.13 s with none).
    if (in.mostly_cached) {
      policy.workers = 0;
      policy.advise_inline = false;
    }
  }
  // A consumer that copies what it loads needs as many bytes again: a checkpoint larger than
  // half of memory cannot stay cached beside its weights, whether cached now or not, so the
  // pass reads its pages once (the views the consumer keeps excepted). Smaller ones keep the
  // kernel's recency, which keeps them cached for the next load. Small ones never ask.
  // One larger than memory is never found cached by a next load (reading it from the start
  // evicts its own end first): read alone, its pages are dropped behind the consumer, which
  // spares the kernel's reclaim (30 GB on 23.5 GiB: 1.8-2.7 million pages reclaimed per load,
  // none dropped; benchmarks/README.md).
  if (in.selected_bytes > defaults::kInlineReadBytes && in.selected_bytes > in.memory_bytes / 2) {
    policy.cache_use = in.selected_bytes > in.memory_bytes && in.alone_on_host
                           ? CacheUse::ReadOnceAndDrop
                           : CacheUse::ReadOnce;
    // Read once (its mapping in 2 MiB folios), a checkpoint kept cached behind the consumer has
    // its window advised rather than populated: advice returns once the reads are queued, so the
    // whole window's reads stay queued (15 GB cold: 2.27-2.35 GB/s against 1.93-1.99
    // populated). One dropped behind it populates (30 GB: 2.65-2.67 against 1.69 advised;
    // benchmarks/README.md). Smaller ones populate too.
    policy.advise = policy.cache_use == CacheUse::ReadOnce;
  }
  return policy;
}

int choose_read_threads(const ReadThreadInputs& in) {
  if (in.concurrency) return in.concurrency;
  int threads = defaults::kConcurrency;
  if (!in.direct && in.mostly_cached && in.cores > 0) {
    // Buffered reads of cached files (and copies from a mapping) are memory copies done by the
    // CPU: more workers than cores only contend (on page faults of fresh memory above all).
    // Reads that wait on the storage (O_DIRECT, or buffered reads of files not cached) keep
    // the default depth: buffered cold reads measured 1.12 s with 2 workers against 0.58 s
    // with 4 (1 GB, one process). Ranks of one host keep this count each: splitting the cores
    // among them (1 worker each on 2 cores) measured 1.16 s against 0.85 s warm (2 ranks,
    // 1 GB).
    threads = std::min(threads, in.cores);
  }
  // Small checkpoints read on the consumer's thread: starting and joining workers would cost
  // more than the reads (100 files of 256 KB: ~0.4 ms per open).
  if (!in.exchanging && in.selected_bytes <= defaults::kInlineReadBytes) threads = 0;
  return threads;
}

uint32_t choose_worker_spin_us(const WorkerSpinInputs& in) {
  // A staged pass of cached files queues one slice of 2-8 MiB at a time as staging frees, and
  // each is a memory copy of 0.15-0.6 ms: a worker that sleeps whenever the queue is empty is
  // woken for the next one 0.2-0.4 ms later at the median on this project's 2-core VMs (an idle
  // virtual CPU's wake-up; read-bound warm on the simulated device, 2026-12-07), longer than
  // the read. Spinning 300 us first (yielding to any runnable thread): copy=True 0.0971 s
  // against 0.1080 (fresh processes, medians of 10); the consumer spinning for completions too
  // was slower (0.1203 against 0.1099). Reads that wait on the storage sleep at once (the wait
  // is the disk's), and so do workers that share the cores: with other processes loading on
  // this host, or more workers than cores (an explicit concurrency).
  constexpr uint32_t kSpinMicros = 300;
  return in.staged && in.mostly_cached && in.alone && in.within_cores ? kSpinMicros : 0;
}

uint64_t choose_staged_read_bytes(const StagedReadInputs& in) {
  if (in.requested) return in.requested;
  const uint64_t chunk = defaults::kChunkBytes;
  // Reads that wait on the storage keep whole chunks, and ranks that plan alike keep the one
  // size every rank computes (a cache, a page cache, differ by host).
  if (!in.mostly_cached || !in.alone || in.last_level_cache == 0) return chunk;
  // Warm reads are copies out of the page cache by the CPU, into the staging ring the copy
  // engine then reads: a ring in use that fits half of the last-level cache is written there,
  // not through to memory. The ring in use is the reads at once, one queued behind each, and two
  // under copy (loader/transfer/staging_stream.cpp). 2 cores, 32 MiB L3, 0.98 GB read-bound on
  // the simulated device, copy=True (fresh processes, medians of 8): 8 MiB slices (a 48 MiB
  // ring) 108.5 ms and 0.204 CPU s; 4 MiB 97.5 and 0.182; 2 MiB 86.5 and 0.150; 1 MiB 92.3
  // and 0.143: a power of two, the chunk at most and 2 MiB at least, since each read and each
  // copy has a fixed cost (the consumer's booking; on a GPU, a copy's launch and its event).
  const uint64_t slots = 2 * static_cast<uint64_t>(std::max(in.reads_at_once, 1)) + 2;
  const uint64_t ring = in.last_level_cache / 2 / std::max(in.processes_on_host, 1);
  uint64_t slice = 2ull << 20;
  while (slice * 2 <= chunk && slots * staging_slot_bytes(slice * 2) <= ring) slice *= 2;
  return std::min(slice, chunk);
}

LoadFilePath choose_load_file_path(const LoadFileInputs& in) {
  // The pass costs about 150 us a file and 2.5 us a tensor (a view each, and at the end each
  // kept view made owned or leased); a read per tensor about 6 us a tensor (a read and the
  // check that the file is unchanged, before and after) plus the copy of its bytes into fresh
  // memory. In-process, warm, a file of 4 tensors: pass 165/185/236/154/180 us against reads
  // 66/98/188/500/3519 us at 64 KiB/256 KiB/1 MiB/4 MiB/16 MiB in all; 16/64/256/1024 tensors
  // of 1-4 KiB: reads 123/407/1695/5985 us, the pass (C++) ~190/230/784/2885
  // (benchmarks/README.md). So files up to 1 MiB and 32 tensors are read. A device target
  // keeps its staged pass; under the mmap backend random access hands out views of the
  // mapping, which only the pass makes owned.
  constexpr uint64_t kEachTensorReadBytes = 1ull << 20;
  constexpr uint64_t kEachTensorReadTensors = 32;
  const bool read = in.host_target && !in.random_access_maps &&
                    in.selected_bytes <= kEachTensorReadBytes &&
                    in.tensors <= kEachTensorReadTensors;
  return read ? LoadFilePath::EachTensorRead : LoadFilePath::OnePass;
}

}  // namespace instanttensor::plan

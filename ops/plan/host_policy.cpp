#include "plan/host_policy.h"

#include "plan/defaults.h"

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

}  // namespace instanttensor::plan

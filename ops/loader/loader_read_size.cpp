// The read size chosen at open: the caller's chunk_size, the default, or, for warm reads into a
// staging ring, a slice that keeps the ring in use within the CPU's last-level cache.
#include <algorithm>
#include <thread>

#include "io/cache_size.h"
#include "io/io_setup.h"
#include "loader/exchange/host_identity.h"
#include "loader/loader.h"
#include "plan/defaults.h"
#include "plan/host_policy.h"

namespace instanttensor {

uint64_t Loader::requested_chunk() const {
  if (!plan_.mode.staged) {
    return options_.chunk_size ? options_.chunk_size : plan::defaults::kChunkBytes;
  }
  static const int cores = static_cast<int>(std::thread::hardware_concurrency());
  plan::StagedReadInputs in;
  in.requested = options_.chunk_size;
  in.mostly_cached = !io_->direct() && io_->mostly_resident();
  in.alone = !plan_.mode.in_step;
  // The workers choose_read_threads gives warm reads (start_reads, after the plan that needs
  // this size): one per core, at most the default, or as asked.
  in.reads_at_once =
      options_.concurrency ? options_.concurrency : std::min(plan::defaults::kConcurrency, cores);
  in.processes_on_host = loader::launcher_local_ranks();
  in.last_level_cache = io::last_level_cache_bytes();
  return plan::choose_staged_read_bytes(in);
}

}  // namespace instanttensor

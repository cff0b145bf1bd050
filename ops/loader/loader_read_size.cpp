// The read sizes chosen at open: the caller's chunk_size or the default, and for warm reads into
// a staging ring, a slice that keeps the ring in use within the CPU's last-level cache.
#include <algorithm>
#include <numeric>
#include <thread>

#include "io/cache_size.h"
#include "io/io_setup.h"
#include "loader/exchange/host_identity.h"
#include "loader/loader.h"
#include "plan/defaults.h"
#include "plan/host_policy.h"

namespace instanttensor {

uint64_t Loader::requested_chunk() const {
  return options_.chunk_size ? options_.chunk_size : plan::defaults::kChunkBytes;
}

uint64_t Loader::staged_read_bytes(const std::vector<uint64_t>& tensor_bytes) const {
  if (!plan_.mode.staged) return plan_.chunk_size;
  static const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const bool direct = io_->direct();
  const bool cached = !direct && io_->mostly_resident();
  // The reads the backend will run at once (start_reads makes the workers after the plan that
  // needs this size): the same choice, from the same inputs.
  const plan::ReadThreadInputs threads_in{
      std::accumulate(tensor_bytes.begin(), tensor_bytes.end(), uint64_t{0}),
      direct,
      !options_.concurrency && cached,
      plan_.mode.exchanging(),
      options_.concurrency,
      cores};
  const int threads = plan::choose_read_threads(threads_in);
  const int depth = options_.io_depth ? options_.io_depth : plan::defaults::kIoDepth;
  plan::StagedReadInputs in;
  in.requested = options_.chunk_size ? plan_.chunk_size : 0;
  in.mostly_cached = cached;
  in.alone = !plan_.mode.in_step;
  in.reads_at_once = io_->reads_at_once(threads, depth);
  // Processes that load beside this one share its cache: a launcher's count, or the group's
  // size where a group took no handshake (its ranks may share this host).
  const auto& group = options_.process_group;
  in.processes_on_host = std::max(loader::launcher_local_ranks(), group ? group->getSize() : 1);
  in.last_level_cache = io::last_level_cache_bytes();
  return std::min(plan::choose_staged_read_bytes(in), plan_.chunk_size);
}

}  // namespace instanttensor

// The reads chosen at open: the caller's chunk_size or the default, and for warm reads into a
// staging ring, a slice that keeps the ring in use within the CPU's last-level cache; the
// workers, and how long an idle one spins.
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

namespace {

// Cores counted once per process: each count reads /sys/devices/system/cpu/online (three system
// calls per open of a small file).
int host_cores() {
  static const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return cores;
}

}  // namespace

int Loader::read_threads(uint64_t selected_bytes) const {
  const int cores = host_cores();
  const bool direct = io_->direct();
  const plan::ReadThreadInputs in{selected_bytes,
                                  direct,
                                  !options_.concurrency && !direct && io_->mostly_resident(),
                                  plan_.mode.exchanging(),
                                  options_.concurrency,
                                  cores};
  return plan::choose_read_threads(in);
}

uint32_t Loader::worker_spin_us(int threads, int local_ranks) const {
  plan::WorkerSpinInputs spin;
  spin.staged = plan_.mode.staged;
  spin.mostly_cached = !io_->direct() && io_->mostly_resident();
  // No other process that may load on this host: no ranks found here, none counted at the open.
  spin.alone = !plan_.mode.in_step && local_ranks <= 1 && processes_on_host() <= 1;
  spin.within_cores = threads <= host_cores();
  return plan::choose_worker_spin_us(spin);
}

int Loader::io_depth() const {
  return options_.io_depth ? options_.io_depth : plan::defaults::kIoDepth;
}

int Loader::processes_on_host() const {
  const auto& group = options_.process_group;
  return std::max(loader::launcher_local_ranks(), group ? group->getSize() : 1);
}

uint64_t Loader::staged_read_bytes(const std::vector<uint64_t>& tensor_bytes) const {
  if (!plan_.mode.staged) return plan_.chunk_size;
  const bool cached = !io_->direct() && io_->mostly_resident();
  // The reads the backend will run at once (start_reads makes the workers after the plan that
  // needs this size): the same choice.
  const int threads =
      read_threads(std::accumulate(tensor_bytes.begin(), tensor_bytes.end(), uint64_t{0}));
  const int depth = io_depth();
  plan::StagedReadInputs in;
  in.requested = options_.chunk_size ? plan_.chunk_size : 0;
  in.mostly_cached = cached;
  in.alone = !plan_.mode.in_step;
  in.reads_at_once = io_->reads_at_once(threads, depth);
  // Processes that load beside this one share its cache.
  in.processes_on_host = processes_on_host();
  in.last_level_cache = io::last_level_cache_bytes();
  return std::min(plan::choose_staged_read_bytes(in), plan_.chunk_size);
}

}  // namespace instanttensor

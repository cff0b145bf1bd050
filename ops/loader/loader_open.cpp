// Opening a checkpoint: options, the load mode, the exchange's handshake, the memory and read
// plans, the read workers, and the parts composed for the mode.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "loader/exchange/host_identity.h"
#include "loader/loader.h"
#include "loader/loader_parts.h"
#include "loader/reads/timing.h"
#include "plan/memory_plan.h"

namespace instanttensor {

using loader::Clock;
using loader::seconds_since;

namespace {

constexpr uint64_t kRingAlignment = 64;
using plan::defaults::kInlineReadBytes;

// Accelerators: "cuda" means the current device, resolved now, so the loader's stream and every
// tensor handed out carry a concrete index.
c10::Device with_index(c10::Device device) {
  if (device.is_cpu() || device.has_index()) return device;
  return c10::impl::getDeviceGuardImpl(device.type())->getDevice();
}

}  // namespace

Loader::Loader(std::vector<std::string> files, const OpenOptions& options) {
  auto start = Clock::now();
  options_ = loader::resolve_options(options);
  options_.device = with_index(options_.device);
  plan_.checkpoint = std::make_unique<format::Checkpoint>(std::move(files));
  std::vector<size_t> selected = selected_indices();
  open_io();
  choose_mode(selected);
  size_and_plan(std::move(selected));
  start_reads();
  compose_parts();
  if (views_) io_->add_note("iteration: " + views_->description());
  stats_.backend = io_->description();
  stats_.exchange = loader::describe_exchange(mode_);
  stats_.buffer_size = plan_.memory.buffer_size;
  stats_.open_seconds = seconds_since(start);
}

void Loader::open_io() {
  std::vector<io::FileToRead> files_to_read;
  for (const auto& file : plan_.checkpoint->files()) {
    files_to_read.push_back(io::FileToRead{file.path, file.fd, file.size});
  }
  io_ = std::make_unique<io::IoSetup>(options_.backends, files_to_read);
  plan_.io_alignment = io_->alignment();
  plan_.ring_alignment = std::max<uint64_t>(kRingAlignment, plan_.io_alignment);
  plan_.chunk_size = plan::round_up(requested_chunk(), plan_.ring_alignment);
}

uint64_t Loader::requested_chunk() const {
  return options_.chunk_size ? options_.chunk_size : plan::defaults::kChunkBytes;
}

bool Loader::shares_host() const {
  return mode_.in_step && !mode_.exchanging() && exchange_->topology().local_ranks > 1;
}

std::vector<size_t> Loader::selected_indices() const {
  std::vector<size_t> selected;
  if (options_.keys) {
    for (const auto& key : *options_.keys) selected.push_back(plan_.checkpoint->index_of(key));
    std::sort(selected.begin(), selected.end());
    selected.erase(std::unique(selected.begin(), selected.end()), selected.end());
  } else {
    for (size_t i = 0; i < plan_.checkpoint->tensors().size(); ++i) selected.push_back(i);
  }
  return selected;
}

void Loader::choose_mode(const std::vector<size_t>& selected) {
  loader::LoadModeInputs in;
  in.accelerator_target = !options_.device.is_cpu();
  in.force_staging = options_.force_staging;
  in.host_fallback = options_.host_fallback;
  in.copy = options_.copy;
  in.mapping_backend = io_->mapping() != nullptr;
  const std::string& first_choice = options_.backends.front();
  in.page_cache_views = first_choice == "auto" || first_choice == "mmap";
  in.exchange_policy = options_.exchange;
  const auto& group = options_.process_group;
  in.distributed = group && group->getSize() > 1;
  if (in.distributed) {
    for (const auto& device : group->getDeviceTypes()) {
      in.group_serves_target |= device.type() == options_.device.type();
    }
  }
  mode_ = loader::choose_load_mode(in);
  if (mode_.staged) device_budget_ = options_.device_budget;
  if (mode_.exchange_fell_back) {
    warnings_.push_back(c10::str("instanttensor: the process group has no backend for ",
                                 options_.device.type(),
                                 " tensors (its backends: ", loader::describe_backends(*group),
                                 "); every rank reads the whole checkpoint itself"));
    if (options_.print_warnings) {
      TORCH_WARN_ONCE(warnings_.back());
    }
  }
  if (!mode_.in_step) return map_files_for_views(in);
  open_exchange(selected);
  device_budget_ = exchange_->agreed_device_budget();
  // The handshake told where every rank runs: the mode's final choice.
  in.hosts = exchange_->topology().hosts;
  mode_ = loader::choose_load_mode(in);
  // Ranks that read alone keep one process's read path, O_DIRECT for cold files included,
  // though each rank then reads the disk itself: buffered reads through the shared page cache
  // measured slower on this project's 2-core machine (benchmarks/README.md).
  if (mode_.exchanging()) {
    exchange_->prepare_gathers(mode_.exchange);
    // Units must be alike on every rank, whatever each one's O_DIRECT alignment: the chunk
    // from the requested size alone (the digest covers that).
    plan_.chunk_size = plan::round_up(requested_chunk(), loader::kMaxDirectAlignment);
  }
  map_files_for_views(in);
}

void Loader::map_files_for_views(loader::LoadModeInputs in) {
  if (!mode_.host_views) return;
  try {
    views_mapping_ = loader::map_for_views(*plan_.checkpoint);
  } catch (const Error& e) {
    // A file that cannot be mapped (a special filesystem): the read path serves iteration.
    in.page_cache_views = false;
    mode_ = loader::choose_load_mode(in);
    io_->add_note(std::string("iteration reads: ") + e.what());
  }
}

void Loader::open_exchange(const std::vector<size_t>& selected) {
  loader::LayoutOptions layout;
  layout.copy = options_.copy;
  layout.buffer_size = options_.buffer_size;
  layout.chunk_size = options_.chunk_size;  // as asked: the rounding differs by alignment
  layout.staging_size = options_.staging_size;
  layout.host_fallback = mode_.host_fallback;
  layout.staged = mode_.staged;
  layout.device_type = static_cast<int>(options_.device.type());
  layout.exchange = options_.exchange;
  std::vector<int> fds;
  for (const auto& file : plan_.checkpoint->files()) fds.push_back(file.fd);
  exchange_ = std::make_unique<loader::ExchangeProtocol>(
      options_.process_group, options_.device,
      loader::layout_digest(*plan_.checkpoint, selected, layout), loader::host_identity(fds),
      device_budget_, plan_.first_path());
}

void Loader::size_and_plan(std::vector<size_t> selected) {
  const auto& tensors = plan_.checkpoint->tensors();
  loader::MemoryInputs in;
  for (size_t index : selected) in.tensor_bytes.push_back(tensors[index].nbytes);
  // Host views, copy=false included, hold no ring: buffer_size is their read-ahead window.
  in.copy = options_.copy || mode_.host_views;
  in.staged = mode_.staged;
  in.host_fallback = mode_.host_fallback;
  in.world = mode_.exchanging() ? exchange_->world() : 1;
  in.buffer_size = options_.buffer_size;
  in.staging_size = options_.staging_size;
  in.chunk_size = plan_.chunk_size;
  // Ranks in step widen alike, whatever each one's alignment (O_DIRECT or not, by its page
  // cache): the exchange's units must match, and a buffer too small must be refused on every
  // rank at once, not on a cold rank alone while the others wait in a round.
  in.read_widening = mode_.in_step ? 2 * loader::kMaxDirectAlignment
                                   : (io_->direct() ? 2 * plan_.io_alignment : 0);
  in.ring_alignment = plan_.ring_alignment;
  in.device_budget = device_budget_;
  auto describe = [&](size_t i) {
    const auto& t = tensors[selected[i]];
    return std::make_pair(plan_.file_of(t), t.name());
  };
  plan_.memory = loader::plan_memory(in, describe, plan_.first_path());
  plan_.reads =
      plan::make_read_plan(*plan_.checkpoint, std::move(selected), plan_.memory.max_group_bytes);
}

void Loader::start_reads() {
  int threads = options_.concurrency ? options_.concurrency : plan::defaults::kConcurrency;
  if (!options_.concurrency && !io_->direct() && io_->mostly_resident()) {
    // Buffered reads of cached files (and copies from a mapping) are memory copies done by the
    // CPU: more workers than cores only contend (on page faults of fresh memory above all).
    // Reads that wait on the storage (O_DIRECT, or buffered reads of files not cached) keep
    // the default depth: buffered cold reads measured 1.12 s with 2 workers against 0.58 s
    // with 4 (1 GB, one process). Ranks of one host keep this count each: splitting the cores
    // among them (1 worker each on 2 cores) measured 1.16 s against 0.85 s warm (2 ranks,
    // 1 GB).
    int cores = static_cast<int>(std::thread::hardware_concurrency());
    if (cores > 0) threads = std::min(threads, cores);
  }
  // Small checkpoints read on the consumer's thread: starting and joining workers would cost
  // more than the reads (100 files of 256 KB: ~0.4 ms per open). An explicit concurrency wins.
  if (!options_.concurrency && !mode_.exchanging() && plan_.reads.total_bytes <= kInlineReadBytes) {
    threads = 0;
  }
  if (shares_host()) {
    io_->add_note(c10::str(exchange_->topology().local_ranks, " ranks on this host"));
  }
  int depth = options_.io_depth ? options_.io_depth : plan::defaults::kIoDepth;
  reads_ = std::make_unique<loader::ReadScheduler>(*io_, threads, depth, plan_.chunk_size, stats_);
}

void Loader::compose_parts() {
  // Half the read-ahead bound: enough for a consumer that drops each tensor after copying it,
  // and the loader's own memory stays within 1.5x buffer_size.
  recycled_ = std::make_shared<pool::RecycledBlocks>(plan_.memory.buffer_size / 2);
  const uint64_t bound = plan_.memory.buffer_size;
  const uint64_t padding = mode_.exchanging() ? plan_.memory.layout.padding() : 0;
  if (mode_.staged) {
    stage_ =
        std::make_unique<loader::DeviceStage>(options_.device, plan_.memory.staging_bytes,
                                              plan_.ring_alignment, plan_.memory.device_ring_bytes);
    staging_ = std::make_unique<loader::StagingStream>(*stage_, *reads_);
    device_owned_ =
        std::make_unique<loader::OwnedPlacement>(plan_, recycled_, stage_.get(), bound, stats_);
    device_ring_placement_ =
        std::make_unique<loader::RingPlacement>(plan_, stage_->device_ring(), padding, stats_);
  }
  host_owned_ = std::make_unique<loader::OwnedPlacement>(plan_, recycled_, nullptr, bound, stats_);
  // Each feed serves the groups its kind of read suits (mode.uses_shares), and skips the others.
  feeds_.push_back(std::make_unique<loader::WholeGroupFeed>(plan_, mode_, *reads_));
  feeds_.push_back(std::make_unique<loader::ShareFeed>(
      plan_, mode_, *reads_, staging_.get(), mode_.exchanging() ? exchange_->rank() : 0, stats_));
  if (mode_.in_step && !mode_.exchanging()) {
    std::vector<uint64_t> item_bytes;
    for (size_t index : plan_.reads.items) {
      item_bytes.push_back(plan_.checkpoint->tensors()[index].nbytes);
    }
    uint64_t stride = loader::StepRounds::kStrideBytes;
#ifdef INSTANTTENSOR_TESTING_HOOKS
    // Test-only: INSTANTTENSOR_TESTING_STEP_ROUND_BYTES=<bytes> puts rounds closer, so small
    // test checkpoints meet between their first and last tensor too.
    if (const char* testing = std::getenv("INSTANTTENSOR_TESTING_STEP_ROUND_BYTES")) {
      stride = loader::parse_byte_size(testing, "INSTANTTENSOR_TESTING_STEP_ROUND_BYTES");
    }
#endif
    step_rounds_ = std::make_unique<loader::StepRounds>(item_bytes, stride);
  }
  factory_ = std::make_unique<loader::TensorFactory>(*plan_.checkpoint, stage_.get(), stats_);
  if (mode_.host_views) {
    // Small checkpoints: the consumer's own page faults cost less than starting workers.
    int threads = options_.concurrency ? options_.concurrency : plan::defaults::kConcurrency;
    if (!options_.concurrency && plan_.reads.total_bytes <= kInlineReadBytes) threads = 0;
    // Files in the page cache: populating maps pages the consumer's own faults map as fast (16
    // at a time), and on few cores the workers take the consumer's time (1 GB warm: 0.35-0.5 s
    // with 2-4 workers against 0.13 s with none).
    if (!options_.concurrency && io_->mostly_resident()) threads = 0;
    views_ = std::make_unique<loader::PageCacheViews>(plan_, std::move(views_mapping_), *factory_,
                                                      stats_, plan_.memory.buffer_size, threads);
  }
  random_ = std::make_unique<loader::RandomAccess>(plan_, mode_, options_.device, device_budget_,
                                                   *io_, *reads_, *factory_, recycled_, stats_);
}

}  // namespace instanttensor

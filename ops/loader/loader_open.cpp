// Opening a checkpoint: options, the load mode, the exchange's handshake, the memory and read
// plans, the read workers, and the parts composed for the mode.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <thread>

#include "loader/loader.h"
#include "loader/memory_plan.h"
#include "loader/timing.h"

namespace instanttensor {

using loader::Clock;
using loader::seconds_since;

namespace {

constexpr uint64_t kRingAlignment = 64;
constexpr uint64_t kDefaultChunk = 8ull << 20;
constexpr int kDefaultConcurrency = 4;
constexpr uint64_t kInlineReadBytes = 8ull << 20;
constexpr int kDefaultIoDepth = 32;

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
  std::vector<io::FileToRead> files_to_read;
  for (const auto& file : plan_.checkpoint->files()) {
    files_to_read.push_back(io::FileToRead{file.path, file.fd, file.size});
  }
  io_ = std::make_unique<io::IoSetup>(options_.backends, files_to_read);
  plan_.io_alignment = io_->alignment();
  plan_.ring_alignment = std::max<uint64_t>(kRingAlignment, plan_.io_alignment);
  plan_.chunk_size = plan::round_up(options_.chunk_size ? options_.chunk_size : kDefaultChunk,
                                    plan_.ring_alignment);
  choose_mode(options);
  open_exchange(selected, options);
  size_and_plan(std::move(selected), options);
  start_reads();
  compose_parts();
  stats_.backend = io_->description();
  stats_.buffer_size = plan_.memory.buffer_size;
  stats_.open_seconds = seconds_since(start);
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

void Loader::choose_mode(const OpenOptions& options) {
  loader::LoadModeInputs in;
  in.accelerator_target = !options_.device.is_cpu();
  in.force_staging = options.force_staging;
  in.host_fallback = options.host_fallback;
  in.copy = options_.copy;
  in.mapping_backend = io_->mapping() != nullptr;
  const auto& group = options.process_group;
  in.distributed = group && group->getSize() > 1;
  if (in.distributed) {
    for (const auto& device : group->getDeviceTypes()) {
      in.group_serves_target |= device.type() == options_.device.type();
    }
  }
  mode_ = loader::choose_load_mode(in);
  if (mode_.staged && options.device_budget) device_budget_ = *options.device_budget;
  if (mode_.exchange_fell_back) {
    warnings_.push_back(c10::str("instanttensor: the process group has no backend for ",
                                 options_.device.type(),
                                 " tensors (its backends: ", loader::describe_backends(*group),
                                 "); every rank reads the whole checkpoint itself"));
    if (options.print_warnings) {
      TORCH_WARN_ONCE(warnings_.back());
    }
  }
}

void Loader::open_exchange(const std::vector<size_t>& selected, const OpenOptions& options) {
  if (!mode_.exchanging()) return;
  loader::LayoutOptions layout;
  layout.copy = options_.copy;
  layout.buffer_size = options_.buffer_size;
  layout.chunk_size = plan_.chunk_size;
  layout.staging_size = options.staging_size.value_or(0);
  layout.host_fallback = mode_.host_fallback;
  layout.staged = mode_.staged;
  layout.device_type = static_cast<int>(options_.device.type());
  c10::Device where = mode_.exchange == loader::ExchangePlace::Host
                          ? c10::Device(c10::DeviceType::CPU)
                          : options_.device;
  exchange_ = std::make_unique<loader::ExchangeProtocol>(
      options.process_group, where, mode_.exchange,
      loader::layout_digest(*plan_.checkpoint, selected, layout), device_budget_,
      plan_.first_path());
}

void Loader::size_and_plan(std::vector<size_t> selected, const OpenOptions& options) {
  const auto& tensors = plan_.checkpoint->tensors();
  loader::MemoryInputs in;
  for (size_t index : selected) in.tensor_bytes.push_back(tensors[index].nbytes);
  in.copy = options_.copy;
  in.staged = mode_.staged;
  in.host_fallback = mode_.host_fallback;
  in.world = exchange_ ? exchange_->world() : 1;
  in.buffer_size = options_.buffer_size;
  in.staging_size = options.staging_size ? static_cast<uint64_t>(*options.staging_size) : 0;
  staging_request_ = in.staging_size;
  in.chunk_size = plan_.chunk_size;
  // Ranks exchanging must size alike, whatever each one's filesystem alignment is.
  in.read_widening =
      exchange_ ? 2 * loader::kMaxDirectAlignment : (io_->direct() ? 2 * plan_.io_alignment : 0);
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
  int threads = options_.concurrency ? options_.concurrency : kDefaultConcurrency;
  if (!options_.concurrency && !io_->direct()) {
    // Buffered reads (and copies from a mapping) are memory copies done by the CPU: more
    // workers than cores only contend (on page faults of fresh memory above all). O_DIRECT
    // workers mostly wait on the device, so they keep the default depth.
    int cores = static_cast<int>(std::thread::hardware_concurrency());
    if (cores > 0) threads = std::min(threads, cores);
  }
  // Small checkpoints read on the consumer's thread: starting and joining workers would cost
  // more than the reads (100 files of 256 KB: ~0.4 ms per open). An explicit concurrency wins.
  if (!options_.concurrency && !exchange_ && plan_.reads.total_bytes <= kInlineReadBytes) {
    threads = 0;
  }
  int depth = options_.io_depth ? options_.io_depth : kDefaultIoDepth;
  reads_ = std::make_unique<loader::ReadScheduler>(*io_, threads, depth, plan_.chunk_size, stats_);
}

void Loader::compose_parts() {
  // Half the read-ahead bound: enough for a consumer that drops each tensor after copying it,
  // and the loader's own memory stays within 1.5x buffer_size.
  recycled_ = std::make_shared<pool::RecycledBlocks>(plan_.memory.buffer_size / 2);
  const uint64_t bound = plan_.memory.buffer_size;
  const uint64_t padding = exchange_ ? plan_.memory.layout.padding() : 0;
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
  whole_groups_ = std::make_unique<loader::WholeGroupFeed>(plan_, mode_, *reads_);
  shares_ = std::make_unique<loader::ShareFeed>(plan_, mode_, *reads_, staging_.get(),
                                                exchange_ ? exchange_->rank() : 0, stats_);
  factory_ = std::make_unique<loader::TensorFactory>(*plan_.checkpoint, stage_.get(), stats_);
  random_ = std::make_unique<loader::RandomAccess>(plan_, mode_, options_.device, device_budget_,
                                                   *io_, *reads_, *factory_, recycled_, stats_);
}

}  // namespace instanttensor

// Opening, composing, queries, random access, load_into and closing; the pass itself is in
// loader_pass.cpp.
#include "loader/loader.h"

#include <ATen/Parallel.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <thread>

#include "loader/load_into.h"
#include "loader/memory_plan.h"

namespace instanttensor {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kRingAlignment = 64;
constexpr uint64_t kDefaultChunk = 8ull << 20;
constexpr int kDefaultConcurrency = 4;
constexpr uint64_t kInlineReadBytes = 8ull << 20;
constexpr int kDefaultIoDepth = 32;

uint64_t round_up(uint64_t value, uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

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
  plan_.chunk_size =
      round_up(options_.chunk_size ? options_.chunk_size : kDefaultChunk, plan_.ring_alignment);
  choose_mode(options);
  open_exchange(selected, options);
  size_and_plan(std::move(selected), options);
  start_reads();
  compose_parts();
  stats_.backend = io_->description();
  stats_.buffer_size = plan_.memory.buffer_size;
  stats_.open_seconds = std::chrono::duration<double>(Clock::now() - start).count();
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
  shares_ = std::make_unique<loader::ShareFeed>(plan_, *reads_, staging_.get(),
                                                exchange_ ? exchange_->rank() : 0, stats_);
  factory_ = std::make_unique<loader::TensorFactory>(*plan_.checkpoint, stage_.get(), stats_);
  random_ = std::make_unique<loader::RandomAccess>(plan_, mode_, options_.device, device_budget_,
                                                   *io_, *reads_, *factory_, recycled_, stats_);
}

Loader::~Loader() {
  try {
    close();
  } catch (...) {
    // close() only throws for allocation failures while copying out retained tensors; a
    // destructor has no one to report to.
  }
}

void Loader::ensure_open() {
  if (closed_) {
    throw Error(ErrorKind::Argument, plan_.checkpoint ? plan_.first_path() : "", "",
                "the checkpoint was closed");
  }
  if (process_.entered_new_process()) leave_parent_work_behind();
}

void Loader::leave_parent_work_behind() {
  // torch's CPU kernels (the copies here use them) run on an OpenMP team that does not survive
  // fork: the child's first parallel copy waits for threads that are gone. One intra-op thread
  // in the child, as torch's own DataLoader workers set.
  if (at::get_num_threads() > 1) at::set_num_threads(1);
  // The parent's workers are gone: their backend is leaked, never joined, and its reads are
  // never waited for. The next read starts workers of this process.
  reads_->abandon_after_fork();
  shares_->reset();
  // A parent thread may have held the pool's lock at the fork; tensors handed out before it
  // keep the old pool (their deleters), new ones use a fresh one.
  recycled_ = std::make_shared<pool::RecycledBlocks>(plan_.memory.buffer_size / 2);
  if (pass_.started && !pass_.error) {
    pass_.error.emplace(
        process_.refusal(plan_.first_path(), "an iteration that was in progress at the fork"));
  }
}

void Loader::refuse_in_child(const std::string& what, bool iteration) const {
  if (!process_.forked()) return;
  bool host_target = options_.device.is_cpu() && !mode_.staged;
  if (!host_target || (iteration && (host_ring_ || exchange_))) {
    throw process_.refusal(plan_.first_path(), what);
  }
}

std::vector<std::string> Loader::offset_keys() const {
  auto lock = mutex_.lock();
  std::vector<std::string> names;
  for (size_t index : plan_.reads.items) names.push_back(plan_.checkpoint->tensors()[index].name());
  return names;
}

std::vector<std::string> Loader::keys() const {
  auto names = offset_keys();
  std::sort(names.begin(), names.end());
  return names;
}

std::optional<std::map<std::string, std::string>> Loader::metadata() const {
  auto lock = mutex_.lock();
  if (!plan_.checkpoint->has_metadata()) return std::nullopt;
  return plan_.checkpoint->metadata();
}

TensorMetadata Loader::get_tensor_metadata(const std::string& name) const {
  auto lock = mutex_.lock();
  auto spec = factory_->spec(selected_tensor(name));
  return TensorMetadata{spec.dtype, spec.shape};
}

Stats Loader::stats() const {
  auto lock = mutex_.lock();
  Stats stats = stats_;
  stats.recycled_blocks = recycled_->reuses();
  return stats;
}

std::vector<std::string> Loader::warnings() const {
  auto lock = mutex_.lock();
  return warnings_;
}

const format::IndexedTensor& Loader::selected_tensor(const std::string& name) const {
  size_t index = plan_.checkpoint->index_of(name);
  const auto& t = plan_.checkpoint->tensors()[index];
  if (!std::binary_search(plan_.reads.items.begin(), plan_.reads.items.end(), index)) {
    throw Error(ErrorKind::Key, plan_.file_of(t), name, "tensor is not among the selected keys");
  }
  return t;
}

at::Tensor Loader::get_tensor(const std::string& name) {
  auto lock = mutex_.lock();
  ensure_open();
  refuse_in_child("get_tensor on an accelerator target", /*iteration=*/false);
  return random_->tensor(selected_tensor(name));
}

at::Tensor Loader::get_rows(const std::string& name, int64_t start, int64_t stop) {
  auto lock = mutex_.lock();
  ensure_open();
  refuse_in_child("get_slice on an accelerator target", /*iteration=*/false);
  return random_->rows(selected_tensor(name), start, stop);
}

LoadIntoResult Loader::load_into(const std::vector<std::string>& names,
                                 const std::vector<at::Tensor>& destinations, bool strict) {
  auto lock = mutex_.lock();
  ensure_open();
  refuse_in_child("load_into on an accelerator target", /*iteration=*/false);
  if (process_.forked()) {
    for (const auto& destination : destinations) {
      if (!destination.device().is_cpu()) {
        throw process_.refusal(plan_.first_path(), "load_into onto a device");
      }
    }
  }
  auto matched =
      loader::match_destinations(*plan_.checkpoint, plan_.reads.items, names, destinations, strict);
  plan_.checkpoint->check_unchanged();
  auto start = Clock::now();
  // The staging_size asked for at open sizes load_into's bounce ring too, staged or not.
  uint64_t staging = loader::staging_ring_bytes(staging_request_, plan_.first_path());
  loader::fill_destinations(matched.fills, *plan_.checkpoint, *io_, *reads_, plan_.chunk_size,
                            staging, mode_.staged && options_.device.is_cpu(), stats_);
  stats_.wait_seconds += std::chrono::duration<double>(Clock::now() - start).count();
  return matched.result;
}

void Loader::close() {
  auto lock = mutex_.lock();
  if (closed_) return;
  closed_ = true;
  if (process_.entered_new_process()) leave_parent_work_behind();
  if (process_.forked()) {
    // The group's and the device's threads, streams and memory were the parent's: leaked here,
    // never joined or synchronized (the parent still owns and closes them).
    (void)exchange_.release();
    (void)stage_.release();
  }
  drain_in_flight();
  pass_.items.clear();
  pass_.groups.clear();
  reads_->stop();  // joins the workers
  io_->close();
  // Retained borrowed tensors must outlive the rings: copy them out now.
  if (exchange_) exchange_->wait_gathers();
  if (stage_) stats_.materializations += stage_->close();
  if (host_ring_) stats_.materializations += host_ring_->release_all();
  host_ring_placement_.reset();
  host_ring_.reset();
  recycled_->close();
  if (options_.debug) {
    std::cerr << "[instanttensor] " << plan_.first_path() << ": " << stats_.bytes_read
              << " bytes in " << stats_.read_requests << " reads, wait " << stats_.wait_seconds
              << " s, read " << stats_.read_seconds << " s, materializations "
              << stats_.materializations << "\n";
  }
  plan_.checkpoint->close_files();
}

}  // namespace instanttensor

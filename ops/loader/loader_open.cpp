// Opening a checkpoint: options, the load mode, the exchange's handshake, the memory and read
// plans, the read workers, and the parts composed for the mode.
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>

#include "format/parsed_checkpoint.h"
#include "io/io_setup.h"
#include "io/memory_limit.h"
#include "loader/access/random_access.h"
#include "loader/access/tensor_memory.h"
#include "loader/exchange/exchange_protocol.h"
#include "loader/exchange/host_identity.h"
#include "loader/exchange/step_rounds.h"
#include "loader/loader.h"
#include "loader/pass/mapped_pass.h"
#include "loader/pass/read_pass.h"
#include "loader/pass/view_pass.h"
#include "loader/reads/read_scheduler.h"
#include "loader/reads/timing.h"
#include "loader/transfer/device_budget.h"
#include "loader/walk/alone_walk.h"
#include "loader/walk/exchanging_walk.h"
#include "loader/walk/in_step_walk.h"
#include "plan/host_policy.h"
#include "plan/memory_plan.h"

namespace instanttensor {

using loader::Clock;
using loader::seconds_since;

namespace {

constexpr uint64_t kRingAlignment = 64;

}  // namespace

Loader::Loader(std::vector<std::string> files, const OpenOptions& options) {
  auto start = Clock::now();
  // First, so that an open failing below never leaves a kept checkpoint's files open: parsed
  // already when the Python layer matched a tensor_filter against the names.
  auto kept = format::take_kept_checkpoint(files);
  options_ = loader::resolve_options(options);
  if (!options.device_budget) {
    options_.device_budget = loader::default_device_budget(options_.device, options_.free_share);
  }
  plan_.checkpoint =
      kept ? std::move(kept) : std::make_unique<format::Checkpoint>(std::move(files));
  std::vector<size_t> selected = selected_indices();
  open_io();
  std::shared_ptr<const io::MappedFiles> mapping;
  auto exchange = choose_mode(selected, mapping);
  settle_read_method();
  const bool exchanging = plan_.mode.exchanging();
  size_and_plan(std::move(selected), exchanging ? exchange->world() : 1);
  // Ranks in step that read alone: the others of this host read beside this one.
  start_reads(exchange && !exchanging ? exchange->topology().local_ranks : 1);
  compose_parts(std::move(exchange), std::move(mapping));
  std::string iteration = pass_->description();
  if (!iteration.empty()) io_->add_note("iteration: " + iteration);
  stats_.backend = io_->description();
  stats_.exchange = plan::describe_exchange(plan_.mode);
  stats_.buffer_size = plan_.memory.buffer_size;
  stats_.read_bytes = plan_.mode.staged ? plan_.memory.staging_slice : plan_.chunk_size;
  stats_.open_seconds = seconds_since(start);
  reads_->timeline().record(loader::PassTimeline::Kind::Open, start, Clock::now());
}

void Loader::open_io() {
  io_ = std::make_unique<io::IoSetup>(options_.backends, *plan_.checkpoint);
}

void Loader::settle_read_method() {
  // Host views read nothing through the backend while iterating: timing cold reads would cost
  // the open 64 MiB of reads for random access and load_into alone.
  io_->choose_cold_read_method(/*time_them=*/!plan_.mode.host_views);
  plan_.io_alignment = io_->alignment();
  // Ranks in step plan their rings alike whatever each one's method (each times its own, and
  // ranks of one host time through one page cache): read groups and refusals must match.
  plan_.ring_alignment =
      std::max<uint64_t>({kRingAlignment, plan_.io_alignment,
                          plan_.mode.in_step ? plan::kMaxDirectAlignment : uint64_t{1}});
  // Exchanging ranks cut units alike whatever each one's O_DIRECT alignment: the chunk from
  // the requested size alone (the digest covers that).
  plan_.chunk_size =
      plan::round_up(requested_chunk(),
                     plan_.mode.exchanging() ? plan::kMaxDirectAlignment : plan_.ring_alignment);
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

std::unique_ptr<loader::ExchangeProtocol> Loader::choose_mode(
    const std::vector<size_t>& selected, std::shared_ptr<const io::MappedFiles>& mapping) {
  plan::LoadModeInputs in;
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
  auto& mode = plan_.mode;
  mode = plan::choose_load_mode(in);
  if (mode.staged) plan_.device_budget = options_.device_budget;
  if (mode.exchange_fell_back) {
    warnings_.push_back(c10::str("instanttensor: the process group has no backend for ",
                                 options_.device.type(),
                                 " tensors (its backends: ", loader::describe_backends(*group),
                                 "); every rank reads the whole checkpoint itself"));
    if (options_.print_warnings) {
      TORCH_WARN_ONCE(warnings_.back());
    }
  }
  std::unique_ptr<loader::ExchangeProtocol> exchange;
  if (mode.in_step) {
    exchange = open_exchange(selected);
    plan_.device_budget = exchange->agreed_device_budget();
    // The handshake told where every rank runs: the mode's final choice.
    in.hosts = exchange->topology().hosts;
    mode = plan::choose_load_mode(in);
    // Ranks that read alone keep one process's read path (the read method timed for cold
    // files included), though each rank then reads the disk itself.
    if (mode.exchanging()) exchange->prepare_gathers(mode.exchange);
  }
  mapping = map_files_for_views(in);
  return exchange;
}

std::shared_ptr<const io::MappedFiles> Loader::map_files_for_views(plan::LoadModeInputs in) {
  if (!plan_.mode.host_views) return nullptr;
  try {
    return loader::map_for_views(*plan_.checkpoint);
  } catch (const Error& e) {
    // A file that cannot be mapped (a special filesystem): the read path serves iteration.
    in.page_cache_views = false;
    plan_.mode = plan::choose_load_mode(in);
    io_->add_note(std::string("iteration reads: ") + e.what());
    return nullptr;
  }
}

std::unique_ptr<loader::ExchangeProtocol> Loader::open_exchange(
    const std::vector<size_t>& selected) {
  loader::LayoutOptions layout;
  layout.copy = options_.copy;
  layout.buffer_size = options_.buffer_size;
  layout.chunk_size = options_.chunk_size;  // as asked: the rounding differs by alignment
  layout.staging_size = options_.staging_size;
  layout.host_fallback = plan_.mode.host_fallback;
  layout.staged = plan_.mode.staged;
  layout.device_type = static_cast<int>(options_.device.type());
  layout.exchange = options_.exchange;
  std::vector<loader::FileIdentity> files;
  for (const auto& file : plan_.checkpoint->files()) files.push_back({file.device, file.inode});
  return std::make_unique<loader::ExchangeProtocol>(
      options_.process_group, options_.device,
      loader::layout_digest(*plan_.checkpoint, selected, layout), loader::host_identity(files),
      plan_.device_budget, plan_.first_path());
}

void Loader::size_and_plan(std::vector<size_t> selected, int world) {
  const auto& tensors = plan_.checkpoint->tensors();
  const auto& mode = plan_.mode;
  plan::MemoryInputs in;
  for (size_t index : selected) in.tensor_bytes.push_back(tensors[index].nbytes);
  // Host views, copy=false included, hold no ring: buffer_size is their read-ahead window.
  in.copy = options_.copy || mode.host_views;
  in.staged = mode.staged;
  in.host_fallback = mode.host_fallback;
  in.world = world;
  in.buffer_size = options_.buffer_size;
  in.staging_size = options_.staging_size;
  in.chunk_size = plan_.chunk_size;
  plan_.staged_read_bytes = staged_read_bytes(in.tensor_bytes);
  in.staged_read_bytes = plan_.staged_read_bytes;
  // Ranks in step widen alike, whatever each one's alignment (O_DIRECT or not, by its page
  // cache and its timing): the exchange's units must match, and a buffer too small must be refused
  // on every rank at once, not on a cold rank alone while the others wait in a round.
  in.read_widening =
      mode.in_step ? 2 * plan::kMaxDirectAlignment : (io_->direct() ? 2 * plan_.io_alignment : 0);
  in.ring_alignment = plan_.ring_alignment;
  in.device_budget = plan_.device_budget;
  auto describe = [&](size_t i) {
    const auto& t = tensors[selected[i]];
    return std::make_pair(plan_.file_of(t), t.name());
  };
  plan_.memory = plan::plan_memory(in, describe, plan_.first_path());
  plan_.reads =
      plan::make_read_plan(*plan_.checkpoint, std::move(selected), plan_.memory.max_group_bytes);
}

void Loader::start_reads(int local_ranks) {
  const int threads = read_threads(plan_.reads.total_bytes);
  if (local_ranks > 1) io_->add_note(c10::str(local_ranks, " ranks on this host"));
  reads_ = std::make_unique<loader::ReadScheduler>(*io_, threads, io_depth(), plan_.chunk_size,
                                                   stats_, worker_spin_us(threads, local_ranks));
  if (options_.timeline) reads_->timeline().enable();
}

std::unique_ptr<loader::Pass> Loader::make_pass(std::shared_ptr<const io::MappedFiles> mapping,
                                                bool alone_on_host) {
  const auto& mode = plan_.mode;
  if (mode.pass_kind() == plan::PassKind::Mapped) {
    return std::make_unique<loader::MappedPass>(plan_, *io_, memory_->factory(), stats_);
  }
  if (mode.pass_kind() == plan::PassKind::PageCacheViews) {
    const plan::HostPolicyInputs in{plan_.reads.total_bytes, io::memory_limit_bytes(),
                                    !options_.concurrency && io_->mostly_resident(), alone_on_host,
                                    options_.concurrency};
    const plan::HostPolicy policy = plan::choose_host_policy(in);
    const io::ReadAheadPolicy read_ahead{
        policy.workers, policy.advise_inline,
        policy.advise ? io::PopulateMethod::WillNeed : io::PopulateMethod::PopulateRead};
    return std::make_unique<loader::ViewPass>(plan_, std::move(mapping), memory_->factory(), stats_,
                                              plan_.memory.buffer_size, read_ahead,
                                              policy.cache_use);
  }
  return std::make_unique<loader::ReadPass>(plan_, *reads_, *memory_, options_.device,
                                            options_.copy, /*rank=*/0, stats_);
}

void Loader::compose_parts(std::unique_ptr<loader::ExchangeProtocol> exchange,
                           std::shared_ptr<const io::MappedFiles> mapping) {
  const auto& mode = plan_.mode;
  memory_ = std::make_unique<loader::TensorMemory>(plan_, options_.device, stats_);
  random_ = std::make_unique<loader::RandomAccess>(plan_, mode, options_.device,
                                                   plan_.device_budget, *io_, *reads_,
                                                   memory_->factory(), memory_->recycled(), stats_);
  // Ranks of a group that took no handshake may share this host: not alone, as far as known
  // (processes_on_host). A launcher's count says whether replicas of this process (torchrun,
  // MPI) read beside it, whatever group this load was given (a group of one, or a subgroup, sees
  // only itself): one that drops pages could drop what a neighbour has not read yet.
  const bool alone_on_host =
      exchange ? exchange->topology().local_ranks == 1 && loader::launcher_local_ranks() == 1
               : processes_on_host() <= 1;
  if (mode.walk_kind() == plan::WalkKind::Exchanging) {
    // Only the read pass exchanges (the mode table gives ranks that exchange no views): made
    // here as such, so the walk gets it with its type, never by a cast.
    auto read = std::make_unique<loader::ReadPass>(plan_, *reads_, *memory_, options_.device,
                                                   options_.copy, exchange->rank(), stats_);
    walk_ = std::make_unique<loader::ExchangingWalk>(*read, std::move(exchange), stats_);
    pass_ = std::move(read);
    return;
  }
  pass_ = make_pass(std::move(mapping), alone_on_host);
  if (mode.walk_kind() == plan::WalkKind::Alone) {
    walk_ = std::make_unique<loader::AloneWalk>(*pass_);
  } else {
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
    walk_ = std::make_unique<loader::InStepWalk>(*pass_, std::move(exchange),
                                                 loader::StepRounds(item_bytes, stride), stats_);
  }
}

}  // namespace instanttensor

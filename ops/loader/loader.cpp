#include "loader/loader.h"

#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <thread>

#include "loader/load_into.h"
#include "loader/memory_plan.h"
#include "loader/storage_views.h"
#include "loader/torch_dtype.h"
#include "pool/host_buffer.h"

namespace instanttensor {

using loader::BorrowRing;
using loader::make_storage;
using loader::tensor_over;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Read tags: a read group's index, a share's sequence number, or a random access.
constexpr uint64_t kShareTag = 1ull << 62;
constexpr uint64_t kRandomAccessTag = 1ull << 63;
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
  checkpoint_ = std::make_unique<format::Checkpoint>(std::move(files));

  std::vector<size_t> selected;
  if (options_.keys) {
    for (const auto& key : *options_.keys) selected.push_back(checkpoint_->index_of(key));
    std::sort(selected.begin(), selected.end());
    selected.erase(std::unique(selected.begin(), selected.end()), selected.end());
  } else {
    for (size_t i = 0; i < checkpoint_->tensors().size(); ++i) selected.push_back(i);
  }
  std::vector<io::FileToRead> files_to_read;
  for (const auto& file : checkpoint_->files()) {
    files_to_read.push_back(io::FileToRead{file.path, file.fd, file.size});
  }
  io_ = std::make_unique<io::IoSetup>(options_.backends, files_to_read);
  io_alignment_ = io_->alignment();
  ring_alignment_ = std::max<uint64_t>(kRingAlignment, io_alignment_);
  chunk_size_ = round_up(options_.chunk_size ? options_.chunk_size : kDefaultChunk,
                         std::max<uint64_t>(io_alignment_, kRingAlignment));
  staged_ = options.force_staging || !options_.device.is_cpu();
  host_fallback_ = staged_ && options.host_fallback;
  if (staged_ && options.device_budget) device_budget_ = *options.device_budget;
  open_exchange(selected, options);
  mapped_access_ = io_->mapping() && !staged_;
  mapped_iteration_ = mapped_access_ && !options_.copy && !exchange_;
  size_and_plan(std::move(selected), options);

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
  if (!options_.concurrency && !exchange_ && plan_.total_bytes <= kInlineReadBytes) threads = 0;
  int depth = options_.io_depth ? options_.io_depth : kDefaultIoDepth;
  reads_ = std::make_unique<loader::ReadScheduler>(*io_, threads, depth, chunk_size_, stats_);
  stats_.backend = io_->description();
  stats_.buffer_size = memory_.buffer_size;
  stats_.open_seconds = seconds_since(start);
}

void Loader::open_exchange(const std::vector<size_t>& selected, const OpenOptions& options) {
  const auto& group = options.process_group;
  if (!group || group->getSize() <= 1) return;
  std::vector<c10::DeviceType> types;
  for (const auto& device : group->getDeviceTypes()) types.push_back(device.type());
  place_ = loader::choose_exchange_place(types, options_.device.type(), staged_);
  if (place_ == loader::ExchangePlace::Local) {
    warnings_.push_back(c10::str("instanttensor: the process group has no backend for ",
                                 options_.device.type(),
                                 " tensors (its backends: ", loader::describe_backends(*group),
                                 "); every rank reads the whole checkpoint itself"));
    if (options.print_warnings) {
      TORCH_WARN_ONCE(warnings_.back());
    }
    return;
  }
  c10::Device where =
      place_ == loader::ExchangePlace::Host ? c10::Device(c10::DeviceType::CPU) : options_.device;
  exchange_ = std::make_unique<loader::RankExchange>(group, where, place_);
  // Before any data moves: every rank must load the same thing the same way.
  device_budget_ = exchange_->handshake(layout_digest(selected, options), device_budget_,
                                        checkpoint_->files()[0].path);
}

void Loader::size_and_plan(std::vector<size_t> selected, const OpenOptions& options) {
  const auto& tensors = checkpoint_->tensors();
  loader::MemoryInputs in;
  for (size_t index : selected) in.tensor_bytes.push_back(tensors[index].nbytes);
  in.copy = options_.copy;
  in.staged = staged_;
  in.host_fallback = host_fallback_;
  in.world = exchange_ ? exchange_->world() : 1;
  in.buffer_size = options_.buffer_size;
  in.staging_size = options.staging_size ? static_cast<uint64_t>(*options.staging_size) : 0;
  staging_request_ = in.staging_size;
  in.chunk_size = chunk_size_;
  // Ranks exchanging must size alike, whatever each one's filesystem alignment is.
  in.read_widening =
      exchange_ ? 2 * loader::kMaxDirectAlignment : (io_->direct() ? 2 * io_alignment_ : 0);
  in.ring_alignment = ring_alignment_;
  in.device_budget = device_budget_;
  auto describe = [&](size_t i) {
    const auto& t = tensors[selected[i]];
    return std::make_pair(file_of(t), t.name());
  };
  memory_ = loader::plan_memory(in, describe, checkpoint_->files()[0].path);
  // Half the read-ahead bound: enough for a consumer that drops each tensor after copying it,
  // and the loader's own memory stays within 1.5x buffer_size.
  recycled_ = std::make_shared<pool::RecycledBlocks>(memory_.buffer_size / 2);
  if (staged_) {
    stage_ = std::make_unique<loader::DeviceStage>(options_.device, memory_.staging_bytes,
                                                   ring_alignment_, memory_.device_ring_bytes);
  }
  plan_ = plan::make_read_plan(*checkpoint_, std::move(selected), memory_.max_group_bytes);
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
    throw Error(ErrorKind::Argument, checkpoint_ ? checkpoint_->files()[0].path : "", "",
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
  staged_shares_.clear();
  shares_in_staging_ = 0;
  // A parent thread may have held the pool's lock at the fork; tensors handed out before it
  // keep the old pool (their deleters), new ones use a fresh one.
  recycled_ = std::make_shared<pool::RecycledBlocks>(memory_.buffer_size / 2);
  if (pass_started_ && !pass_error_) {
    pass_error_.emplace(process_.refusal(checkpoint_->files()[0].path,
                                         "an iteration that was in progress at the fork"));
  }
}

namespace {
constexpr const char* kIterationInChild =
    "iterating a checkpoint with borrowed buffers, a process group or an accelerator target";
}  // namespace

void Loader::refuse_in_child(const std::string& what, bool iteration) const {
  if (!process_.forked()) return;
  bool host_target = options_.device.is_cpu() && !staged_;
  if (!host_target || (iteration && (host_ring_ || exchange_))) {
    throw process_.refusal(checkpoint_->files()[0].path, what);
  }
}

const format::IndexedTensor& Loader::tensor_of_item(size_t item) const {
  return checkpoint_->tensors()[plan_.items[item]];
}

const format::IndexedTensor& Loader::first_tensor(size_t group) const {
  return tensor_of_item(plan_.groups[group].first_item);
}

const std::string& Loader::file_of(const format::IndexedTensor& t) const {
  return checkpoint_->files()[t.file_index].path;
}

std::vector<std::string> Loader::offset_keys() const {
  auto lock = mutex_.lock();
  std::vector<std::string> names;
  for (size_t index : plan_.items) names.push_back(checkpoint_->tensors()[index].name());
  return names;
}

std::vector<std::string> Loader::keys() const {
  auto names = offset_keys();
  std::sort(names.begin(), names.end());
  return names;
}

std::optional<std::map<std::string, std::string>> Loader::metadata() const {
  auto lock = mutex_.lock();
  if (!checkpoint_->has_metadata()) return std::nullopt;
  return checkpoint_->metadata();
}

TensorMetadata Loader::get_tensor_metadata(const std::string& name) const {
  auto lock = mutex_.lock();
  const auto& t = selected_tensor(name);
  return TensorMetadata{loader::to_torch_dtype(t.entry->dtype, file_of(t), name),
                        loader::to_torch_shape(*t.entry, file_of(t))};
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

BorrowRing& Loader::host_ring() {
  if (!host_ring_) {
    host_streams_ = std::make_unique<loader::LoaderStreams>(c10::Device(c10::DeviceType::CPU));
    host_ring_ =
        std::make_unique<BorrowRing>(*host_streams_, BorrowRing::Memory::Host,
                                     memory_.host_ring_bytes, ring_alignment_, "the borrow buffer");
  }
  return *host_ring_;
}

uint64_t Loader::layout_digest(const std::vector<size_t>& selected,
                               const OpenOptions& options) const {
  // FNV-1a over what must agree across ranks: files, headers, selection, and the options that
  // shape the plan, the units and the rings.
  uint64_t hash = 1469598103934665603ull;
  auto mix = [&](const void* data, size_t size) {
    for (size_t i = 0; i < size; ++i) {
      hash = (hash ^ static_cast<const uint8_t*>(data)[i]) * 1099511628211ull;
    }
  };
  auto mix_value = [&](uint64_t value) { mix(&value, sizeof(value)); };
  for (const auto& file : checkpoint_->files()) {
    mix_value(file.size);
    mix_value(file.header.header_length);
  }
  for (size_t index : selected) {
    const auto& t = checkpoint_->tensors()[index];
    mix(t.name().data(), t.name().size());
    mix_value(t.file_offset);
    mix_value(t.nbytes);
  }
  mix_value(options_.copy);
  mix_value(options_.buffer_size);
  mix_value(chunk_size_);
  mix_value(options.staging_size.value_or(0));
  mix_value(host_fallback_);
  mix_value(staged_);
  mix_value(static_cast<uint64_t>(options_.device.type()));
  return hash;
}

void Loader::drain_in_flight() noexcept {
  // Reads of an abandoned pass still target its memory: finish them before anything is reused.
  reads_->drain();
  staged_shares_.clear();
  shares_in_staging_ = 0;
}

void Loader::begin_pass() {
  drain_in_flight();
  if (exchange_) exchange_->wait_gathers();
  ++pass_id_;
  pass_started_ = true;
  pass_error_.reset();
  deferred_failure_.reset();
  groups_.assign(plan_.groups.size(), GroupState{});
  items_.assign(plan_.items.size(), ItemState{});
  next_group_ = 0;
  next_item_ = 0;
  ahead_bytes_ = 0;
  staging_group_ = 0;
  try {
    checkpoint_->check_unchanged();
  } catch (const Error& e) {
    pass_error_.emplace(e);  // the pass is over before it began; next() keeps saying why
    throw;
  }
}

void Loader::restart() {
  auto lock = mutex_.lock();
  ensure_open();
  refuse_in_child(kIterationInChild, /*iteration=*/true);
  if (exchange_) {
    // Distributed: the pass begins inside the first next(), where a failure (a changed file)
    // travels with the first status round instead of raising on this rank alone.
    drain_in_flight();
    pass_started_ = false;
    pass_error_.reset();
    return;
  }
  begin_pass();
}

bool Loader::reclaim_oldest_region(BorrowRing& ring, bool force) {
  auto& regions = ring.regions();
  if (regions.empty()) return false;
  const auto& oldest = regions.front();
  if (oldest.pass == pass_id_) {
    size_t end = oldest.first_item + oldest.item_count;
    // Items not handed out yet are read-ahead; the item handed out last is live (the consumer's
    // loop variable still binds it) and is only copied out when nothing else can make room.
    bool live_or_pending = end + 1 > next_item_;
    if (end > next_item_) return false;
    if (live_or_pending && !force) return false;
  }
  auto start = Clock::now();
  stats_.materializations += ring.release_oldest();
  stats_.copy_seconds += seconds_since(start);
  return true;
}

Loader::Destination Loader::destination_of(size_t g) const {
  bool ring = !options_.copy || exchanging();
  if (!staged_) return ring ? Destination::HostRing : Destination::HostOwned;
  if (host_fallback_ && first_tensor(g).nbytes > device_budget_) return Destination::HostOwned;
  return ring ? Destination::DeviceRing : Destination::DeviceOwned;
}

bool Loader::uses_shares(const GroupState& state) const {
  return state.where == Destination::DeviceRing || state.where == Destination::DeviceOwned ||
         (state.where == Destination::HostRing && exchanging());
}

void Loader::borrow_items(size_t g, BorrowRing& ring, BorrowRing::Region& region) {
  const plan::ReadGroup& group = plan_.groups[g];
  region.pass = pass_id_;
  region.first_item = group.first_item;
  region.item_count = group.item_count;
  uint64_t offset = 0;
  for (size_t item = group.first_item; item < group.first_item + group.item_count; ++item) {
    uint64_t nbytes = tensor_of_item(item).nbytes;
    items_[item].borrowed = ring.borrow(region, groups_[g].dest + offset, nbytes);
    offset += nbytes;
  }
}

bool Loader::place_group(size_t g, bool force) {
  const plan::ReadGroup& group = plan_.groups[g];
  GroupState& state = groups_[g];
  state.where = destination_of(g);
  state.range = plan::align_range(group.file_offset, group.length, io_alignment_);
  if (group.length == 0) {  // only empty tensors: nothing to place or read, on any rank
    state.placed = state.landed = true;
    return true;
  }
  if (state.where == Destination::HostOwned || state.where == Destination::DeviceOwned) {
    if (ahead_bytes_ > 0 && ahead_bytes_ + group.length > memory_.buffer_size && !force)
      return false;
    // Owned groups hold one tensor: its bytes land in the tensor's own storage (one pass); on
    // the host, O_DIRECT's widening lives in the same block, outside the tensor.
    c10::DataPtr memory = state.where == Destination::HostOwned
                              ? recycled_->allocate_window(state.range.span, state.range.prefix,
                                                           ring_alignment_, "a tensor")
                              : stage_->allocate_owned(group.length);
    state.dest = static_cast<uint8_t*>(memory.get());
    items_[group.first_item].owned = make_storage(std::move(memory), group.length);
    ahead_bytes_ += group.length;
    stats_.peak_pool_bytes = std::max(stats_.peak_pool_bytes, ahead_bytes_);
    state.placed = true;
    return true;
  }
  const bool on_device = state.where == Destination::DeviceRing;
  BorrowRing& ring = on_device ? stage_->device_ring() : host_ring();
  const auto& first = first_tensor(g);
  const uint64_t data_offset =
      first.file_offset - checkpoint_->files()[first.file_index].header.data_start();
  // Keep each tensor's alignment relative to the data buffer; an O_DIRECT host region starts
  // on a block instead, so data sits at its file offset modulo the block size. The exchange
  // writes up to padding() bytes past the group (equal slices).
  const uint64_t padding = exchanging() ? memory_.layout.padding() : 0;
  const uint64_t span = on_device ? group.length + padding : state.range.span + padding;
  const uint64_t phase = on_device ? data_offset : (io_alignment_ > 1 ? 0 : data_offset);
  BorrowRing::Region* region;
  while (!(region = ring.place(span, phase))) {
    if (!reclaim_oldest_region(ring, force)) return false;
  }
  state.dest = region->data + (on_device ? 0 : state.range.prefix);
  borrow_items(g, ring, *region);
  stats_.peak_pool_bytes = std::max(stats_.peak_pool_bytes, ring.bytes_in_use());
  state.placed = true;
  return true;
}

void Loader::submit_group(size_t g) {
  GroupState& state = groups_[g];
  if (state.landed || uses_shares(state)) return;  // shares go through submit_shares()
  // The whole group, read by this rank (single-process, local fallback, host-fallback tensor).
  if (reads_->submit(plan_.groups[g].file_index, state.range, state.dest - state.range.prefix, g) ==
      0) {
    state.landed = true;
  }
}

bool Loader::submit_shares(size_t g) {
  GroupState& state = groups_[g];
  if (state.landed || !uses_shares(state)) return true;
  const plan::ReadGroup& group = plan_.groups[g];
  const int rank = exchange_ ? exchange_->rank() : 0;
  const size_t units = unit_count(g);
  while (state.units_submitted < units) {
    auto unit = memory_.layout.unit(group.length, state.units_submitted);
    StagedShare share;
    share.group = g;
    share.group_offset = unit.share_begin(rank);
    share.nbytes = unit.share_end(rank) - share.group_offset;
    if (share.nbytes > 0) {
      auto range =
          plan::align_range(group.file_offset + share.group_offset, share.nbytes, io_alignment_);
      share.tag = kShareTag | share_sequence_++;
      uint8_t* read_at;
      if (state.where == Destination::HostRing) {
        // The host exchange: straight into its place (O_DIRECT widening stays inside the
        // group's aligned span, and only ever writes the file's own bytes there).
        read_at = state.dest + share.group_offset - range.prefix;
      } else {
        BorrowRing& staging = stage_->staging();
        BorrowRing::Region* region;
        while (!(region = staging.place(range.span, 0))) {
          // Only staging space whose bytes were already copied to the device can be reused.
          if (staging.regions().size() <= shares_in_staging_) return false;
          staging.release_oldest();
        }
        read_at = region->data;
        share.staged = region->data + range.prefix;
        share.in_staging_ring = true;
        shares_in_staging_ += 1;
      }
      reads_->submit(group.file_index, range, read_at, share.tag);
    }
    staged_shares_.push_back(share);
    state.units_submitted += 1;
  }
  return true;
}

void Loader::land_shares() {
  while (!staged_shares_.empty()) {
    StagedShare& share = staged_shares_.front();
    GroupState& state = groups_[share.group];
    if (share.nbytes > 0) {
      if (!reads_->done(share.tag)) return;
      auto failure = reads_->failure(share.tag);
      reads_->forget(share.tag);
      if (failure) fail_pass(read_error(*failure, first_tensor(share.group)));
    }
    if (share.in_staging_ring) {
      auto start = Clock::now();
      loader::CopyFence copied =
          stage_->copy_to_device(share.staged, state.dest + share.group_offset, share.nbytes);
      stats_.copy_seconds += seconds_since(start);
      // The oldest staging region not yet copied is this share's (both are in order).
      auto& regions = stage_->staging().regions();
      regions[regions.size() - shares_in_staging_].readers_done = copied;
      shares_in_staging_ -= 1;
      state.landed_fence = copied;
    }
    state.units_landed += 1;
    if (state.units_landed == unit_count(share.group)) state.landed = true;
    staged_shares_.pop_front();
  }
}

void Loader::pump() {
  while (next_group_ < plan_.groups.size()) {
    if (!place_group(next_group_, /*force=*/false)) break;
    submit_group(next_group_++);
  }
  while (staging_group_ < next_group_ && submit_shares(staging_group_)) ++staging_group_;
}

void Loader::fail_pass(Error error) {
  drain_in_flight();
  pass_error_.emplace(std::move(error));
  throw *pass_error_;
}

Error Loader::read_error(const loader::ReadFailure& failure, const format::IndexedTensor& t) const {
  return loader::read_failure_error(failure, file_of(t), t.name());
}

void Loader::check_pass_reads() {
  auto failed = reads_->first_failed_tag();
  if (!failed || (*failed & kRandomAccessTag)) return;
  size_t group = *failed;
  if (*failed & kShareTag) {
    for (const auto& share : staged_shares_) {
      if (share.tag == *failed) group = share.group;
    }
  }
  fail_pass(read_error(*reads_->failure(*failed), first_tensor(group)));
}

void Loader::wait_until_landed(size_t g, size_t units) {
  auto start = Clock::now();
  GroupState& state = groups_[g];
  auto enough = [&] { return state.landed || (units != SIZE_MAX && state.units_landed >= units); };
  while (true) {
    land_shares();
    if (!state.landed && !uses_shares(state) && reads_->done(g)) {
      auto failure = reads_->failure(g);
      reads_->forget(g);
      if (failure) fail_pass(read_error(*failure, first_tensor(g)));
      state.landed = true;
    }
    if (enough()) break;
    pump();  // staging space freed by copies lets more shares in
    land_shares();
    if (enough()) break;
    if (reads_->in_flight() == 0) {
      throw Error(ErrorKind::Io, file_of(first_tensor(g)), first_tensor(g).name(),
                  "internal: waiting for a read that was never submitted");
    }
    reads_->wait_one();
    check_pass_reads();
  }
  stats_.wait_seconds += seconds_since(start);
  if (!state.verified) {
    // Re-stat after the reads: a writer updates the mtime before its bytes reach the page cache,
    // so bytes written in place since open are caught here, before any tensor of them goes out.
    const auto& first = first_tensor(g);
    try {
      checkpoint_->check_unchanged(first.file_index, first.name());
    } catch (const Error& e) {
      fail_pass(e);
    }
    state.verified = state.landed;
  }
}

void Loader::make_ready(size_t item, bool wait) {
  size_t g = plan_.group_of[item];
  pump();
  if (!groups_[g].placed) {
    // Nothing is ahead and the ring only holds handed-out tensors: make room even if that means
    // copying out the live one.
    if (!place_group(g, /*force=*/true)) {
      throw Error(ErrorKind::Io, file_of(tensor_of_item(item)), tensor_of_item(item).name(),
                  "internal: no room in the borrow buffer");
    }
    submit_group(next_group_++);
    pump();
  }
  if (wait) wait_until_landed(g);
}

void Loader::exchange_group(size_t g, std::optional<Error> failure) {
  GroupState& state = groups_[g];
  const plan::ReadGroup& group = plan_.groups[g];
  const std::string& file = file_of(first_tensor(g));
  if (!failure && deferred_failure_) failure = std::move(deferred_failure_);
  deferred_failure_.reset();
  const size_t units = unit_count(g);
  if (!uses_shares(state) || units == 0) {
    // Read whole by every rank (a tensor that stays on the host) or only empty tensors: a
    // status round alone, so a failure still reaches every rank.
    if (!failure) {
      try {
        wait_until_landed(g);
      } catch (const Error& e) {
        failure = e;
      }
    }
    exchange_->check_statuses(failure, file);
    state.units_exchanged = 1;
    return;
  }
  const c10::Device device = exchange_->device();
  uint64_t own = 0;
  while (state.units_exchanged < units) {
    size_t u = state.units_exchanged;
    if (!failure) {
      try {
        wait_until_landed(g, u + 1);  // this rank's share of unit u is in place
      } catch (const Error& e) {
        failure = e;
      }
    }
    auto start = Clock::now();
    exchange_->check_statuses(failure, file);
    stats_.exchange_seconds += seconds_since(start);
    auto unit = memory_.layout.unit(group.length, u);
    own += unit.share_end(exchange_->rank()) - unit.share_begin(exchange_->rank());
    at::Tensor bytes =
        loader::byte_view(state.dest + unit.begin, unit.slice * exchange_->world(), device);
    if (staged_) {
      // After the copies of this rank's share, queued on the loader's stream.
      c10::DeviceGuard guard(device);
      c10::StreamGuard on_loader(stage_->streams().loader());
      exchange_->gather(bytes);
    } else {
      exchange_->gather(bytes);
    }
    state.units_exchanged += 1;
  }
  stats_.bytes_received += group.length - own;
}

void Loader::release_consumed_device_regions() {
  if (!stage_) return;
  // The consumer asked for the next tensor: its work on every tensor handed out so far is
  // queued. One event per region marks that point; reuse waits on that region's event only.
  for (auto& region : stage_->device_ring().regions()) {
    if (region.pass == pass_id_ && region.first_item + region.item_count > next_item_) break;
    if (!region.release_marked) stage_->device_ring().mark_released(region);
  }
}

at::Tensor Loader::to_target_device(at::Tensor tensor) const {
  if (options_.device.is_cpu()) return tensor;
  if (host_fallback_ && tensor.nbytes() > device_budget_) return tensor;
  // Random access reads one tensor at a time into its own host storage: a plain copy suffices.
  return tensor.to(options_.device);
}

at::Tensor Loader::owned_copy(const at::Tensor& tensor) const {
  uint64_t nbytes = tensor.nbytes();
  const auto* from = static_cast<const uint8_t*>(tensor.data_ptr());
  c10::DataPtr fresh;
  if (tensor.device().is_cpu()) {
    fresh = pool::allocate_host(nbytes, false, "a tensor");
    std::memcpy(fresh.get(), from, nbytes);
  } else {
    fresh = stage_->copy_on_device(from, nbytes);
  }
  return tensor_over(make_storage(std::move(fresh), nbytes), tensor.scalar_type(),
                     tensor.sizes().vec());
}

std::pair<std::string, at::Tensor> Loader::hand_out(size_t item) {
  const auto& t = tensor_of_item(item);
  const std::string& file = file_of(t);
  ItemState& state = items_[item];
  GroupState& group = groups_[plan_.group_of[item]];
  next_item_ = item + 1;
  // Take the owned storage before anything can throw, so a tensor torch cannot represent
  // (F6) is skipped cleanly and the read-ahead budget stays right.
  auto owned = std::move(state.owned);
  if (owned) ahead_bytes_ -= t.nbytes;
  auto dtype = loader::to_torch_dtype(t.entry->dtype, file, t.name());
  auto shape = loader::to_torch_shape(*t.entry, file);
  stats_.tensors_loaded += 1;
  const bool on_device =
      group.where == Destination::DeviceOwned || group.where == Destination::DeviceRing;
  const c10::Device device = on_device ? options_.device : c10::Device(c10::DeviceType::CPU);
  c10::DeviceGuard guard(device);
  if (t.nbytes == 0) {
    // An empty tensor: nothing read, nothing exchanged; it lives where its group would.
    return {t.name(), tensor_over(make_storage(c10::DataPtr(nullptr, device), 0), dtype, shape)};
  }
  if (exchanging()) {
    auto start = Clock::now();
    exchange_->wait_gathers();  // the consumer's stream (or the host) waits for the bytes
    stats_.exchange_seconds += seconds_since(start);
  } else if (on_device) {
    group.landed_fence.block(stage_->streams().consumer(), "landed");
  }
  at::Tensor tensor;
  if (owned) {
    tensor = tensor_over(std::move(owned), dtype, shape);
  } else {
    tensor = tensor_over(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(state.borrowed), dtype,
                         shape);
    // copy=true through a ring (the exchange): the consumer gets its own bytes.
    if (options_.copy) {
      auto start = Clock::now();
      tensor = owned_copy(tensor);
      stats_.copy_seconds += seconds_since(start);
      return {t.name(), tensor};
    }
  }
  return {t.name(), aligned(tensor)};
}

at::Tensor Loader::aligned(at::Tensor tensor) {
  if (reinterpret_cast<uintptr_t>(tensor.data_ptr()) % tensor.element_size() == 0) return tensor;
  // Unaligned data in the file (legal, if odd): hand out an aligned copy, never a misaligned
  // pointer that element-wise kernels may not expect.
  auto start = Clock::now();
  at::Tensor copy = owned_copy(tensor);
  stats_.misaligned_copies += 1;
  stats_.copy_seconds += seconds_since(start);
  return copy;
}

std::optional<std::pair<std::string, at::Tensor>> Loader::next() {
  auto lock = mutex_.lock();
  ensure_open();
  refuse_in_child(kIterationInChild, /*iteration=*/true);
  if (!exchange_) {
    if (!pass_started_) begin_pass();
    if (pass_error_) throw *pass_error_;
    if (next_item_ >= plan_.items.size()) return std::nullopt;
    size_t item = next_item_;
    if (mapped_iteration_) {
      next_item_ = item + 1;
      const auto& t = tensor_of_item(item);
      auto dtype = loader::to_torch_dtype(t.entry->dtype, file_of(t), t.name());
      auto shape = loader::to_torch_shape(*t.entry, file_of(t));
      stats_.tensors_loaded += 1;
      return std::make_pair(t.name(),
                            aligned(tensor_over(mapped_storage(t, 0, t.nbytes), dtype, shape)));
    }
    release_consumed_device_regions();
    make_ready(item, /*wait=*/true);
    pump();
    return hand_out(item);
  }
  // Distributed: every rank walks the same items and the same status rounds, so a failure here
  // (a changed file, a read error, no memory) travels with the next round and raises on every
  // rank together.
  if (pass_error_) throw *pass_error_;
  if (pass_started_ && next_item_ >= plan_.items.size()) return std::nullopt;
  size_t item = pass_started_ ? next_item_ : 0;
  if (item >= plan_.items.size()) {
    begin_pass();
    return std::nullopt;
  }
  std::optional<Error> failure;
  try {
    if (!pass_started_) begin_pass();
    release_consumed_device_regions();
    make_ready(item, /*wait=*/false);
  } catch (const Error& e) {
    failure = e;
  }
  size_t g = plan_.group_of[item];
  if (groups_.empty()) {
    if (failure) throw *failure;
  } else if (groups_[g].units_exchanged == 0) {
    try {
      exchange_group(g, failure);
    } catch (const Error& e) {
      drain_in_flight();
      pass_error_.emplace(e);
      throw;
    }
  } else if (failure) {
    deferred_failure_ = failure;  // this group is already here; the next round carries it
  }
  try {
    pump();
  } catch (const Error& e) {
    deferred_failure_ = e;
  }
  return hand_out(item);
}

const format::IndexedTensor& Loader::selected_tensor(const std::string& name) const {
  size_t index = checkpoint_->index_of(name);
  const auto& t = checkpoint_->tensors()[index];
  if (!std::binary_search(plan_.items.begin(), plan_.items.end(), index)) {
    throw Error(ErrorKind::Key, file_of(t), name, "tensor is not among the selected keys");
  }
  return t;
}

c10::intrusive_ptr<c10::StorageImpl> Loader::read_owned(const format::IndexedTensor& t,
                                                        uint64_t offset, uint64_t nbytes) {
  checkpoint_->check_unchanged(t.file_index, t.name());
  if (mapped_access_) return mapped_storage(t, offset, nbytes);
  auto range = plan::align_range(t.file_offset + offset, nbytes, io_alignment_);
  auto window = recycled_->allocate_window(range.span, range.prefix, ring_alignment_, "a tensor");
  auto* dest = static_cast<uint8_t*>(window.get()) - range.prefix;
  auto storage = make_storage(std::move(window), nbytes);
  reads_->submit(t.file_index, range, dest, kRandomAccessTag);
  // Reads of the iteration may complete in between; they are booked for next() as usual.
  auto start = Clock::now();
  while (!reads_->done(kRandomAccessTag)) reads_->wait_one();
  stats_.wait_seconds += seconds_since(start);
  auto failure = reads_->failure(kRandomAccessTag);
  reads_->forget(kRandomAccessTag);
  if (failure) throw read_error(*failure, t);
  checkpoint_->check_unchanged(t.file_index, t.name());  // written in place during the read?
  return storage;
}

c10::intrusive_ptr<c10::StorageImpl> Loader::mapped_storage(const format::IndexedTensor& t,
                                                            uint64_t offset,
                                                            uint64_t nbytes) const {
  const auto& mapping = io_->mapping();
  return loader::make_storage_kept_by(mapping->data(t.file_index) + t.file_offset + offset, nbytes,
                                      mapping);
}

at::Tensor Loader::get_tensor(const std::string& name) {
  auto lock = mutex_.lock();
  ensure_open();
  refuse_in_child("get_tensor on an accelerator target", /*iteration=*/false);
  const auto& t = selected_tensor(name);
  auto dtype = loader::to_torch_dtype(t.entry->dtype, file_of(t), name);
  auto shape = loader::to_torch_shape(*t.entry, file_of(t));
  auto storage = read_owned(t, 0, t.nbytes);
  stats_.tensors_loaded += 1;
  return to_target_device(aligned(tensor_over(std::move(storage), dtype, shape)));
}

at::Tensor Loader::get_rows(const std::string& name, int64_t start, int64_t stop) {
  auto lock = mutex_.lock();
  ensure_open();
  refuse_in_child("get_slice on an accelerator target", /*iteration=*/false);
  const auto& t = selected_tensor(name);
  auto dtype = loader::to_torch_dtype(t.entry->dtype, file_of(t), name);
  auto shape = loader::to_torch_shape(*t.entry, file_of(t));
  if (shape.empty()) {
    throw Error(ErrorKind::Argument, file_of(t), name, "a 0-d tensor has no rows to slice");
  }
  int64_t rows = shape[0];
  if (start < 0 || stop < start || stop > rows) {
    throw Error(ErrorKind::Argument, file_of(t), name,
                "rows [" + std::to_string(start) + ", " + std::to_string(stop) +
                    ") are outside [0, " + std::to_string(rows) + ")");
  }
  uint64_t row_bytes = rows == 0 ? 0 : t.nbytes / static_cast<uint64_t>(rows);
  shape[0] = stop - start;
  // Rows are contiguous in a row-major file: only their byte range is read.
  auto storage = read_owned(t, static_cast<uint64_t>(start) * row_bytes,
                            static_cast<uint64_t>(stop - start) * row_bytes);
  return to_target_device(aligned(tensor_over(std::move(storage), dtype, shape)));
}

LoadIntoResult Loader::load_into(const std::vector<std::string>& names,
                                 const std::vector<at::Tensor>& destinations, bool strict) {
  auto lock = mutex_.lock();
  ensure_open();
  refuse_in_child("load_into on an accelerator target", /*iteration=*/false);
  if (process_.forked()) {
    for (const auto& destination : destinations) {
      if (!destination.device().is_cpu()) {
        throw process_.refusal(checkpoint_->files()[0].path, "load_into onto a device");
      }
    }
  }
  auto matched = loader::match_destinations(*checkpoint_, plan_.items, names, destinations, strict);
  checkpoint_->check_unchanged();
  auto start = Clock::now();
  // The staging_size asked for at open sizes load_into's bounce ring too, staged or not.
  uint64_t staging = loader::staging_ring_bytes(staging_request_, checkpoint_->files()[0].path);
  loader::fill_destinations(matched.fills, *checkpoint_, *io_, *reads_, chunk_size_, staging,
                            staged_ && options_.device.is_cpu(), stats_);
  stats_.wait_seconds += seconds_since(start);
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
  items_.clear();
  groups_.clear();
  reads_->stop();  // joins the workers
  io_->close();
  // Retained borrowed tensors must outlive the rings: copy them out now.
  if (exchange_) exchange_->wait_gathers();
  if (stage_) stats_.materializations += stage_->close();
  if (host_ring_) stats_.materializations += host_ring_->release_all();
  host_ring_.reset();
  recycled_->close();
  if (options_.debug) {
    std::cerr << "[instanttensor] " << checkpoint_->files()[0].path << ": " << stats_.bytes_read
              << " bytes in " << stats_.read_requests << " reads, wait " << stats_.wait_seconds
              << " s, read " << stats_.read_seconds << " s, materializations "
              << stats_.materializations << "\n";
  }
  checkpoint_->close_files();
}

}  // namespace instanttensor

#include "loader/loader.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>

#include "loader/storage_views.h"
#include "loader/torch_dtype.h"
#include "pool/host_buffer.h"

namespace instanttensor {

using loader::make_storage;
using loader::tensor_over;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

constexpr uint64_t kRandomAccessTag = 1ull << 63;
constexpr uint64_t kRingAlignment = 64;
constexpr uint64_t kDefaultChunk = 8ull << 20;
constexpr uint64_t kDefaultReadAhead = 256ull << 20;
constexpr uint64_t kDefaultStaging = 64ull << 20;
constexpr int kDefaultConcurrency = 4;
constexpr int kDefaultIoDepth = 32;

}  // namespace

Loader::Loader(std::vector<std::string> files, const OpenOptions& options) {
  auto start = Clock::now();
  options_ = loader::resolve_options(options);
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
  chunk_size_ = options_.chunk_size ? options_.chunk_size : kDefaultChunk;
  chunk_size_ = (chunk_size_ + io_alignment_ - 1) / io_alignment_ * io_alignment_;

  // Size the pool before planning: borrowed groups must stay well inside the ring.
  uint64_t largest = 0, total = 0;
  std::string largest_name;
  for (size_t index : selected) {
    const auto& t = checkpoint_->tensors()[index];
    total += t.nbytes;
    if (t.nbytes > largest) largest = t.nbytes, largest_name = t.name();
  }
  // A tensor's region: its bytes, widened to whole O_DIRECT blocks, plus placement slack.
  const uint64_t widening = io_->direct() ? 2 * io_alignment_ : 0;
  const uint64_t slot = largest + ring_alignment_ + widening;
  const uint64_t whole = total + (ring_alignment_ + widening) * selected.size() + slot;
  auto refuse = [&](const char* option, uint64_t have, uint64_t need) {
    const auto& t = checkpoint_->tensors()[checkpoint_->index_of(largest_name)];
    throw Error(ErrorKind::Argument, file_of(t), largest_name,
                "tensor of " + std::to_string(largest) + " bytes does not fit " + option + "=" +
                    std::to_string(have) + " bytes (needs at least " + std::to_string(need) + ")");
  };
  if (options_.copy) {
    buffer_size_ = options_.buffer_size ? options_.buffer_size
                                        : std::max<uint64_t>(std::min(total, kDefaultReadAhead), 1);
  } else {
    // Two of the largest (the live one and the next) plus read-ahead, but never more than the
    // whole selection needs: a small checkpoint gets a small buffer.
    buffer_size_ =
        options_.buffer_size ? options_.buffer_size : std::min(2 * slot + kDefaultReadAhead, whole);
    if (slot > buffer_size_) refuse("a borrow buffer of buffer_size", buffer_size_, slot);
  }
  staged_ = options.force_staging || !options_.device.is_cpu();
  host_borrow_ = !options_.copy || staged_;
  if (staged_) {
    // Reads land in a small host staging ring (pinned for accelerators) and are copied on.
    host_ring_bytes_ = options.staging_size ? static_cast<uint64_t>(*options.staging_size)
                                            : std::min(slot + kDefaultStaging, whole);
    if (slot > host_ring_bytes_) refuse("a staging buffer of staging_size", host_ring_bytes_, slot);
    if (options.device_budget) {
      uint64_t budget = static_cast<uint64_t>(*options.device_budget);
      if (!options_.copy && buffer_size_ > budget) {
        throw Error(ErrorKind::Argument, checkpoint_->files()[0].path, "",
                    "buffer_size=" + std::to_string(buffer_size_) +
                        " bytes exceeds the device memory budget of " + std::to_string(budget) +
                        " bytes (max_free_mem_usage x free device memory)");
      }
      if (largest > budget && !options.host_fallback) {
        refuse("the device memory budget", budget, largest);
      }
      device_budget_ = budget;
    }
    host_fallback_ = options.host_fallback;
    stage_ = std::make_unique<loader::DeviceStage>(options_.device, options_.copy, buffer_size_);
  } else {
    host_ring_bytes_ = buffer_size_;
  }
  uint64_t max_group = host_borrow_ ? std::min(chunk_size_, host_ring_bytes_ / 4) : 0;
  plan_ = plan::make_read_plan(*checkpoint_, std::move(selected), max_group);

  if (options.process_group && options.process_group->getSize() > 1) {
    exchange_ = std::make_unique<loader::RankExchange>(options.process_group);
    std::vector<uint64_t> group_bytes;
    for (const auto& group : plan_.groups) group_bytes.push_back(group.length);
    owner_ = loader::assign_owners(group_bytes, exchange_->world());
    // Before any data moves: every rank must be loading the same thing.
    exchange_->handshake(checkpoint_digest(), checkpoint_->files()[0].path);
  }
  int threads = options_.concurrency ? options_.concurrency : kDefaultConcurrency;
  int depth = options_.io_depth ? options_.io_depth : kDefaultIoDepth;
  reads_ = std::make_unique<loader::ReadScheduler>(*io_, threads, depth, chunk_size_, stats_);
  stats_.backend = io_->description();
  stats_.buffer_size = buffer_size_;
  stats_.open_seconds = seconds_since(start);
}

Loader::~Loader() {
  try {
    close();
  } catch (...) {
    // close() only throws for torch allocation failures while copying out retained tensors;
    // a destructor has no one to report to.
  }
}

void Loader::ensure_open() const {
  if (closed_) {
    throw Error(ErrorKind::Argument, checkpoint_ ? checkpoint_->files()[0].path : "", "",
                "the checkpoint was closed");
  }
}

const format::IndexedTensor& Loader::tensor_of_item(size_t item) const {
  return checkpoint_->tensors()[plan_.items[item]];
}

const std::string& Loader::file_of(const format::IndexedTensor& t) const {
  return checkpoint_->files()[t.file_index].path;
}

std::vector<std::string> Loader::offset_keys() const {
  std::lock_guard<std::mutex> lock(mutex_);
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
  std::lock_guard<std::mutex> lock(mutex_);
  if (!checkpoint_->has_metadata()) return std::nullopt;
  return checkpoint_->metadata();
}

TensorMetadata Loader::get_tensor_metadata(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto& t = selected_tensor(name);
  return TensorMetadata{loader::to_torch_dtype(t.entry->dtype, file_of(t), name),
                        loader::to_torch_shape(*t.entry, file_of(t))};
}

Stats Loader::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Stats out = stats_;
  if (stage_) out.materializations += stage_->materializations();
  return out;
}

loader::BorrowRing& Loader::host_ring() {
  if (!host_ring_) {
    host_streams_ = std::make_unique<loader::LoaderStreams>(c10::Device(c10::DeviceType::CPU));
    bool pinned = staged_ && !options_.device.is_cpu();
    host_ring_ = std::make_unique<loader::BorrowRing>(
        *host_streams_,
        pinned ? loader::BorrowRing::Memory::Pinned : loader::BorrowRing::Memory::Host,
        host_ring_bytes_, ring_alignment_, "the borrow buffer");
  }
  return *host_ring_;
}

void Loader::drain_in_flight() noexcept {
  // Reads of an abandoned pass still target its memory: finish them before anything is reused.
  reads_->drain();
}

void Loader::begin_pass() {
  drain_in_flight();
  ++pass_id_;
  pass_started_ = true;
  pass_error_.reset();
  groups_.assign(plan_.groups.size(), GroupState{});
  items_.assign(plan_.items.size(), ItemState{});
  next_group_ = 0;
  next_item_ = 0;
  ahead_bytes_ = 0;
  try {
    checkpoint_->check_unchanged();
  } catch (const Error& e) {
    pass_error_.emplace(e);  // the pass is over before it began; next() keeps saying why
    throw;
  }
}

void Loader::restart() {
  std::lock_guard<std::mutex> lock(mutex_);
  ensure_open();
  if (exchange_) {
    // Distributed: the pass begins inside the first next(), where a failure (a changed file)
    // travels with the first exchange instead of raising on this rank alone.
    drain_in_flight();
    pass_started_ = false;
    pass_error_.reset();
    return;
  }
  begin_pass();
}

bool Loader::reclaim_oldest_region(bool force) {
  auto& regions = host_ring().regions();
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
  stats_.materializations += host_ring().release_oldest();
  stats_.copy_seconds += seconds_since(start);
  return true;
}

bool Loader::place_group(size_t g, bool force) {
  const plan::ReadGroup& group = plan_.groups[g];
  GroupState& state = groups_[g];
  state.range = plan::align_range(group.file_offset, group.length, io_alignment_);
  if (!host_borrow_) {
    if (ahead_bytes_ > 0 && ahead_bytes_ + group.length > buffer_size_ && !force) return false;
    for (size_t item = group.first_item; item < group.first_item + group.item_count; ++item) {
      uint64_t nbytes = tensor_of_item(item).nbytes;
      if (nbytes == 0) {
        items_[item].owned = make_storage(pool::allocate_host(0, false, "a tensor"), 0);
        continue;
      }
      // Copy groups hold one non-empty tensor: the read lands in the tensor's own storage (one
      // pass over the bytes); O_DIRECT's widening lives in the same block, outside the tensor.
      auto window = pool::allocate_host_window(state.range.span, state.range.prefix,
                                               ring_alignment_, "a tensor");
      state.dest = static_cast<uint8_t*>(window.get()) - state.range.prefix;
      items_[item].owned = make_storage(std::move(window), nbytes);
    }
    ahead_bytes_ += group.length;
    stats_.peak_pool_bytes = std::max(stats_.peak_pool_bytes, ahead_bytes_);
    return true;
  }
  if (group.length == 0) return true;  // only empty tensors: nothing to place
  auto& ring = host_ring();
  // Buffered: keep each tensor's alignment relative to the data buffer. O_DIRECT: the region
  // starts on a block, so data sits at its file offset modulo the block size.
  const auto& first = tensor_of_item(group.first_item);
  uint64_t phase =
      io_alignment_ > 1
          ? 0
          : first.file_offset - checkpoint_->files()[first.file_index].header.data_start();
  loader::BorrowRing::Region* region;
  while (!(region = ring.place(state.range.span, phase))) {
    if (!reclaim_oldest_region(force)) return false;
  }
  state.dest = region->data;
  region->pass = pass_id_;
  region->first_item = group.first_item;
  region->item_count = group.item_count;
  uint64_t offset = state.range.prefix;
  for (size_t item = group.first_item; item < group.first_item + group.item_count; ++item) {
    uint64_t nbytes = tensor_of_item(item).nbytes;
    items_[item].borrowed = ring.borrow(*region, state.dest + offset, nbytes);
    offset += nbytes;
  }
  stats_.peak_pool_bytes = std::max(stats_.peak_pool_bytes, ring.bytes_in_use());
  return true;
}

uint64_t Loader::checkpoint_digest() const {
  // FNV-1a over what must agree across ranks: file sizes and headers, the selection.
  uint64_t hash = 1469598103934665603ull;
  auto mix = [&](const void* data, size_t size) {
    for (size_t i = 0; i < size; ++i) {
      hash = (hash ^ static_cast<const uint8_t*>(data)[i]) * 1099511628211ull;
    }
  };
  for (const auto& file : checkpoint_->files()) {
    mix(&file.size, sizeof(file.size));
    mix(&file.header.header_length, sizeof(file.header.header_length));
  }
  for (size_t index : plan_.items) {
    const auto& t = checkpoint_->tensors()[index];
    mix(t.name().data(), t.name().size());
    mix(&t.file_offset, sizeof(t.file_offset));
    mix(&t.nbytes, sizeof(t.nbytes));
  }
  return hash;
}

void Loader::receive_group(size_t g, std::optional<Error> failure) {
  GroupState& state = groups_[g];
  if (state.exchanged) {
    if (failure) throw *failure;
    return;
  }
  const plan::ReadGroup& group = plan_.groups[g];
  try {
    uint8_t* data = state.dest ? state.dest + state.range.prefix : nullptr;
    exchange_->exchange(owner_[g], data, failure ? 0 : group.length, failure);
  } catch (const Error& e) {
    drain_in_flight();
    pass_error_.emplace(e);
    throw;
  }
  state.exchanged = true;
  if (!reads_here(g)) stats_.bytes_received += group.length;
  state.done = true;
}

void Loader::submit_group(size_t g) {
  GroupState& state = groups_[g];
  state.submitted = true;
  if (plan_.groups[g].length == 0) {  // nothing to read or send, on any rank
    state.done = true;
    return;
  }
  if (!reads_here(g)) return;  // another rank reads it; receive_group() brings the bytes
  if (reads_->submit(plan_.groups[g].file_index, state.range, state.dest, g) == 0) {
    state.done = true;
  }
}

void Loader::pump() {
  while (next_group_ < plan_.groups.size()) {
    if (!place_group(next_group_, /*force=*/false)) break;
    submit_group(next_group_++);
  }
}

void Loader::fail_pass(Error error) {
  drain_in_flight();
  pass_error_.emplace(std::move(error));
  throw *pass_error_;
}

Error Loader::read_error(const loader::ReadFailure& failure, const format::IndexedTensor& t) const {
  if (failure.error != 0) {
    return Error(error_kind_for_errno(failure.error), file_of(t), t.name(),
                 std::string("read failed: ") + std::strerror(failure.error));
  }
  return Error(ErrorKind::Io, file_of(t), t.name(), "file shrank during the load (short read)");
}

void Loader::check_pass_reads() {
  auto failed = reads_->first_failed_tag();
  if (!failed || (*failed & kRandomAccessTag)) return;
  fail_pass(
      read_error(*reads_->failure(*failed), tensor_of_item(plan_.groups[*failed].first_item)));
}

void Loader::wait_for_group(size_t g) {
  auto start = Clock::now();
  while (!groups_[g].done) {
    if (reads_->done(g)) {
      groups_[g].done = true;
      reads_->forget(g);
      break;
    }
    if (reads_->in_flight() == 0) {
      throw Error(ErrorKind::Io, "", "", "internal: waiting for a read that was never submitted");
    }
    reads_->wait_one();
    check_pass_reads();
    pump();
  }
  stats_.wait_seconds += seconds_since(start);
}

at::Tensor Loader::to_target_device(at::Tensor tensor) const {
  if (options_.device.is_cpu()) return tensor;
  if (host_fallback_ && tensor.nbytes() > device_budget_) return tensor;
  // Random access reads one tensor at a time into its own host storage: a plain copy suffices.
  return tensor.to(options_.device);
}

std::pair<std::string, at::Tensor> Loader::hand_out(size_t item) {
  const auto& t = tensor_of_item(item);
  const std::string& file = file_of(t);
  ItemState& state = items_[item];
  next_item_ = item + 1;
  // Take the owned storage before anything can throw, so a tensor torch cannot represent
  // (F6) is skipped cleanly and the read-ahead budget stays right.
  auto owned = std::move(state.owned);
  if (!host_borrow_) ahead_bytes_ -= t.nbytes;
  auto dtype = loader::to_torch_dtype(t.entry->dtype, file, t.name());
  auto shape = loader::to_torch_shape(*t.entry, file);
  stats_.tensors_loaded += 1;
  if (!host_borrow_) return {t.name(), aligned(tensor_over(std::move(owned), dtype, shape))};
  at::Tensor host;
  if (state.borrowed == nullptr) {  // an empty tensor: nothing in the ring
    host = tensor_over(make_storage(pool::allocate_host(0, false, "a tensor"), 0), dtype, shape);
  } else {
    auto storage = c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(state.borrowed);
    host = aligned(tensor_over(std::move(storage), dtype, shape));
  }
  if (!staged_) return {t.name(), host};
  if (host_fallback_ && t.nbytes > device_budget_) {
    return {t.name(), host.clone()};  // too large for the device budget: an owned CPU tensor
  }
  loader::CopyFence staging_free;
  at::Tensor on_device = stage_->transfer(host, &staging_free);
  auto& regions = host_ring().regions();
  for (auto region = regions.rbegin(); region != regions.rend(); ++region) {
    if (region->pass == pass_id_ && region->first_item <= item &&
        item < region->first_item + region->item_count) {
      region->readers_done = staging_free;
      break;
    }
  }
  return {t.name(), on_device};
}

at::Tensor Loader::aligned(at::Tensor tensor) {
  if (reinterpret_cast<uintptr_t>(tensor.data_ptr()) % tensor.element_size() == 0) return tensor;
  // Unaligned data in the file (legal, if odd): hand out an aligned copy, never a misaligned
  // pointer that element-wise kernels may not expect.
  auto start = Clock::now();
  uint64_t nbytes = tensor.nbytes();
  auto owned = make_storage(pool::allocate_host(nbytes, false, "an unaligned tensor"), nbytes);
  std::memcpy(owned->mutable_data(), tensor.data_ptr(), nbytes);
  stats_.misaligned_copies += 1;
  stats_.copy_seconds += seconds_since(start);
  return tensor_over(std::move(owned), tensor.scalar_type(), tensor.sizes().vec());
}

void Loader::make_ready(size_t item) {
  size_t g = plan_.group_of[item];
  pump();
  if (!groups_[g].submitted) {
    // Nothing is ahead and the ring only holds handed-out tensors: make room even if that means
    // copying out the live one.
    if (!place_group(g, /*force=*/true)) {
      throw Error(ErrorKind::Io, file_of(tensor_of_item(item)), tensor_of_item(item).name(),
                  "internal: no room in the borrow buffer");
    }
    submit_group(next_group_++);
  }
  if (reads_here(g)) wait_for_group(g);
}

std::optional<std::pair<std::string, at::Tensor>> Loader::next() {
  std::lock_guard<std::mutex> lock(mutex_);
  ensure_open();
  if (!exchange_) {
    if (!pass_started_) begin_pass();
    if (pass_error_) throw *pass_error_;
    if (next_item_ >= plan_.items.size()) return std::nullopt;
    size_t item = next_item_;
    make_ready(item);
    pump();
    return hand_out(item);
  }
  // Distributed: every rank walks the same items, so any failure here (a changed file, a read
  // error, no memory) is carried by this item's exchange and raises on every rank together.
  if (pass_error_) throw *pass_error_;
  if (pass_started_ && next_item_ >= plan_.items.size()) return std::nullopt;
  std::optional<Error> failure;
  size_t item = pass_started_ ? next_item_ : 0;
  if (item >= plan_.items.size()) {
    begin_pass();
    return std::nullopt;
  }
  try {
    if (!pass_started_) begin_pass();
    make_ready(item);
  } catch (const Error& e) {
    failure = e;
  }
  if (!groups_.empty()) {
    receive_group(plan_.group_of[item], failure);
  } else if (failure) {
    throw *failure;
  }
  pump();
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
  if (pass_error_) throw *pass_error_;
  checkpoint_->check_unchanged();
  auto range = plan::align_range(t.file_offset + offset, nbytes, io_alignment_);
  auto window = pool::allocate_host_window(range.span, range.prefix, ring_alignment_, "a tensor");
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
  return storage;
}

at::Tensor Loader::get_tensor(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  ensure_open();
  const auto& t = selected_tensor(name);
  auto dtype = loader::to_torch_dtype(t.entry->dtype, file_of(t), name);
  auto shape = loader::to_torch_shape(*t.entry, file_of(t));
  auto storage = read_owned(t, 0, t.nbytes);
  stats_.tensors_loaded += 1;
  return to_target_device(aligned(tensor_over(std::move(storage), dtype, shape)));
}

at::Tensor Loader::get_rows(const std::string& name, int64_t start, int64_t stop) {
  std::lock_guard<std::mutex> lock(mutex_);
  ensure_open();
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

void Loader::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return;
  closed_ = true;
  drain_in_flight();
  if (stage_) stage_->close();
  // Retained borrowed tensors must outlive the ring: copy them out now.
  if (host_ring_) stats_.materializations += host_ring_->release_all();
  items_.clear();
  groups_.clear();
  reads_->stop();  // joins the workers
  io_->close();
  host_ring_.reset();
  if (options_.debug) {
    std::cerr << "[instanttensor] " << checkpoint_->files()[0].path << ": " << stats_.bytes_read
              << " bytes in " << stats_.read_requests << " reads, wait " << stats_.wait_seconds
              << " s, read " << stats_.read_seconds << " s, materializations "
              << stats_.materializations << "\n";
  }
  checkpoint_->close_files();
}

}  // namespace instanttensor

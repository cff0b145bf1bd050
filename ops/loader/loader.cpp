// Queries, random access, load_into, fork and closing; opening is in loader_open.cpp, the pass
// in loader_pass.cpp, the steps of ranks in step in loader_in_step.cpp.
#include "loader/loader.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>

#include "loader/access/load_into.h"
#include "loader/loader_parts.h"
#include "loader/reads/timing.h"
#include "plan/memory_plan.h"

namespace instanttensor {

using loader::Clock;
using loader::seconds_since;

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
  for (auto& feed : feeds_) feed->reset();
  if (views_) {
    views_->abandon_after_fork();
    views_->release_all();
  }
  // A parent thread may have held the pool's lock at the fork; tensors handed out before it
  // keep the old pool (their deleters), new ones use a fresh one.
  recycled_ = std::make_shared<pool::RecycledBlocks>(plan_.memory.buffer_size / 2);
  host_owned_->replace_pool(recycled_);
  if (device_owned_) device_owned_->replace_pool(recycled_);
  random_->replace_pool(recycled_);
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
  uint64_t staging = loader::staging_ring_bytes(options_.staging_size, plan_.first_path());
  loader::fill_destinations(matched.fills, *plan_.checkpoint, *io_, *reads_, plan_.chunk_size,
                            staging, mode_.staged && options_.device.is_cpu(), stats_);
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
  pass_.items.clear();
  pass_.groups.clear();
  reads_->stop();  // joins the workers
  io_->close();
  // Retained borrowed tensors must outlive the rings: copy them out now.
  if (exchange_) exchange_->wait_gathers();
  if (stage_) stats_.materializations += stage_->close();
  if (host_ring_) stats_.materializations += host_ring_->release_all();
  views_.reset();  // kept views made owned before the files close; read-ahead joined
  host_ring_placement_.reset();
  host_ring_.reset();
  recycled_->close();
  if (options_.debug) {
    // Ranks print one line each into one stream: the rank says whose line it is, and the line
    // goes out in one write, so that lines of processes sharing the stream do not interleave.
    std::string rank =
        exchange_ ? c10::str(" (rank ", exchange_->rank(), " of ", exchange_->world(), ")") : "";
    std::string line = c10::str(
        "[instanttensor] ", plan_.first_path(), rank, ": ", stats_.bytes_read, " bytes in ",
        stats_.read_requests, " reads, wait ", stats_.wait_seconds, " s, read ",
        stats_.read_seconds, " s, materializations ", stats_.materializations, ", copy ",
        options_.copy ? "owned" : "borrowed", ", exchange: ", stats_.exchange, "\n");
    std::fwrite(line.data(), 1, line.size(), stderr);
  }
  plan_.checkpoint->close_files();
}

}  // namespace instanttensor

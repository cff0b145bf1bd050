// The iteration, queries, random access, load_into, fork and closing; opening is in
// loader_open.cpp.
#include "loader/loader.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>

#include "io/io_setup.h"
#include "loader/access/load_into.h"
#include "loader/access/random_access.h"
#include "loader/access/tensor_memory.h"
#include "loader/pass/pass.h"
#include "loader/reads/read_scheduler.h"
#include "loader/reads/timing.h"
#include "loader/walk/walk.h"
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
  pass_->leave_parent_work_behind();
  const auto& recycled = memory_->replace_pool_after_fork();
  pass_->replace_pool(recycled);
  random_->replace_pool(recycled);
  pass_->refuse_after_fork(
      process_.refusal(plan_.first_path(), "an iteration that was in progress at the fork"));
}

void Loader::refuse_in_child(const std::string& what, bool iteration) const {
  if (!process_.forked()) return;
  bool host_target = options_.device.is_cpu() && !plan_.mode.staged;
  if (!host_target || (iteration && (pass_->borrows_ring() || !walk_->works_in_child()))) {
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
  auto spec = memory_->factory().spec(selected_tensor(name));
  return TensorMetadata{spec.dtype, spec.shape};
}

Stats Loader::stats() const {
  auto lock = mutex_.lock();
  Stats stats = stats_;
  stats.recycled_blocks = memory_->recycled()->reuses();
  // Open: counted live; closed: as close() left it (later refusals are other loaders').
  if (!closed_) stats.advice_refused = io::advice_refusals() - advice_refusals_at_open_;
  if (loader::DeviceStage* stage = memory_->stage()) {
    std::string staging = stage->staging().staging_memory();
    if (!staging.empty()) stats.staging = std::move(staging);
    stats.staging_bytes = std::max(stats.staging_bytes, stage->staging().allocated_bytes());
    stats.device_ring_bytes = stage->device_ring().allocated_bytes();
  }
  return stats;
}

std::vector<TimelineEvent> Loader::timeline() const {
  auto lock = mutex_.lock();
  return reads_ ? reads_->timeline().events() : std::vector<TimelineEvent>{};
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
  uint64_t staging = plan::staging_ring_bytes(options_.staging_size, plan_.first_path());
  loader::fill_destinations(matched.fills, *plan_.checkpoint, *io_, *reads_,
                            plan_.mode.staged ? plan_.staged_read_bytes : plan_.chunk_size, staging,
                            plan_.mode.staged && options_.device.is_cpu(), stats_);
  stats_.wait_seconds += seconds_since(start);
  return matched.result;
}

void Loader::restart() {
  auto lock = mutex_.lock();
  ensure_open();
  refuse_in_child(kIterationInChild, /*iteration=*/true);
  walk_->restart();
}

std::optional<std::pair<std::string, at::Tensor>> Loader::next() {
  auto lock = mutex_.lock();
  ensure_open();
  refuse_in_child(kIterationInChild, /*iteration=*/true);
  auto item = walk_->next();
  if (item)
    reads_->timeline().instant(loader::PassTimeline::Kind::TensorOut, item->second.nbytes());
  return item;
}

void Loader::close() {
  auto lock = mutex_.lock();
  if (closed_) return;
  closed_ = true;
  if (process_.entered_new_process()) leave_parent_work_behind();
  if (process_.forked()) {
    // The group's and the device's threads, streams and memory were the parent's: leaked here,
    // never joined or synchronized (the parent still owns and closes them).
    walk_->leave_behind_after_fork();
    memory_->leave_stage_behind();
  }
  pass_->drain();
  reads_->drain();  // whatever the pass: nothing may still write into memory freed below
  pass_->forget_items();
  reads_->stop();  // joins the workers
  io_->close();
  // Retained borrowed tensors must outlive the rings: copied out now, once the gathers into
  // them are done; kept views are made owned before the files close.
  walk_->close();
  stats_.materializations += memory_->close_stage();
  stats_.materializations += pass_->release_memory();
  memory_->close_pool();
  stats_.advice_refused = io::advice_refusals() - advice_refusals_at_open_;
  if (options_.debug) print_debug_line();
  plan_.checkpoint->close_files();
}

void Loader::print_debug_line() const {
  // Ranks print one line each into one stream: the rank says whose line it is, and the line
  // goes out in one write, so that lines of processes sharing the stream do not interleave.
  std::string line =
      c10::str("[instanttensor] ", plan_.first_path(), walk_->rank_label(), ": ", stats_.bytes_read,
               " bytes in ", stats_.read_requests, " reads, wait ", stats_.wait_seconds,
               " s, read ", stats_.read_seconds, " s, materializations ", stats_.materializations,
               ", copy ", options_.copy ? "owned" : "borrowed", ", exchange: ", stats_.exchange);
  if (stats_.advice_refused > 0) {
    line += c10::str(", advice refused ", stats_.advice_refused,
                     " times (first in this process: ", io::first_advice_refusal(), ")");
  }
  line += "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace instanttensor

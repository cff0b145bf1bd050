// The memory one loader's tensors come from, shared by the pass and random access: recycled host
// blocks, the transfer stage of a staged target, and the factory that makes tensors over them.
#pragma once

#include <memory>

#include "instanttensor/instanttensor.h"
#include "loader/access/tensor_factory.h"
#include "loader/pass/pass_state.h"
#include "loader/transfer/device_stage.h"
#include "pool/recycled_blocks.h"

namespace instanttensor::loader {

// Consumer thread only (the loader's lock). The parts that allocate keep the pool's shared
// pointer (their tensors' deleters do), so a forked child's fresh pool is handed to them by the
// loader (replace_pool_after_fork).
class TensorMemory {
 public:
  // For `plan` (fixed at open, outlives this) and `target` (a concrete index): a stage for a
  // staged mode, nothing allocated before first use; copies are booked in `stats`.
  TensorMemory(const PassPlan& plan, c10::Device target, Stats& stats);

  // Host memory of owned tensors the consumer dropped, reused for the next ones: half the
  // read-ahead bound, enough for a consumer that drops each tensor after copying it, so the
  // loader's own memory stays within 1.5x buffer_size.
  const std::shared_ptr<pool::RecycledBlocks>& recycled() const { return recycled_; }
  // The transfer stage; null unless the mode is staged.
  DeviceStage* stage() const { return stage_.get(); }
  TensorFactory& factory() const { return *factory_; }

  // In a forked child: a parent thread may have held the pool's lock at the fork. Tensors handed
  // out before keep the old pool (their deleters); returns the fresh one for new tensors.
  const std::shared_ptr<pool::RecycledBlocks>& replace_pool_after_fork();
  // In a forked child at close: the device's streams and memory were the parent's, leaked here,
  // never synchronized (the parent still owns and closes them).
  void leave_stage_behind() { (void)stage_.release(); }
  // At close, in this order around the pass's release_memory: copies out borrowed device
  // tensors still held (they must outlive the rings) and frees the stage, returning the tensors
  // copied out; then stops recycling. Both idempotent.
  uint64_t close_stage() { return stage_ ? stage_->close() : 0; }
  void close_pool() { recycled_->close(); }

 private:
  uint64_t pool_capacity_;
  std::shared_ptr<pool::RecycledBlocks> recycled_;
  std::unique_ptr<DeviceStage> stage_;
  std::unique_ptr<TensorFactory> factory_;
};

}  // namespace instanttensor::loader

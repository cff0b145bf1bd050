#include "loader/access/tensor_memory.h"

namespace instanttensor::loader {

TensorMemory::TensorMemory(const PassPlan& plan, c10::Device target, Stats& stats)
    : pool_capacity_(plan.memory.buffer_size / 2),
      recycled_(std::make_shared<pool::RecycledBlocks>(pool_capacity_)) {
  if (plan.mode.staged) {
    stage_ = std::make_unique<DeviceStage>(target, plan.memory.staging_bytes, plan.ring_alignment,
                                           plan.memory.device_ring_bytes,
                                           plan::staging_ring_min_bytes(plan.memory.staging_slice));
  }
  factory_ = std::make_unique<TensorFactory>(*plan.checkpoint, stage_.get(), stats);
}

const std::shared_ptr<pool::RecycledBlocks>& TensorMemory::replace_pool_after_fork() {
  recycled_ = std::make_shared<pool::RecycledBlocks>(pool_capacity_);
  return recycled_;
}

}  // namespace instanttensor::loader

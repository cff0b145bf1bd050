// Random access: one tensor, or a range of its rows, read on demand into its own storage (or
// viewed in the file mapping), beside any pass in progress on the same read scheduler.
#pragma once

#include <ATen/ATen.h>

#include <memory>

#include "io/io_setup.h"
#include "loader/access/tensor_factory.h"
#include "loader/pass/pass_state.h"
#include "loader/reads/read_scheduler.h"
#include "plan/load_mode.h"
#include "pool/recycled_blocks.h"

namespace instanttensor::loader {

class RandomAccess {
 public:
  // Everything referenced outlives this object; host memory comes from `recycled`. Consumer
  // thread, under the loader's lock.
  RandomAccess(const PassPlan& plan, const plan::LoadMode& mode, c10::Device target,
               uint64_t device_budget, io::IoSetup& io, ReadScheduler& reads,
               TensorFactory& factory, std::shared_ptr<pool::RecycledBlocks> recycled, Stats& stats)
      : plan_(plan),
        mode_(mode),
        target_(target),
        device_budget_(device_budget),
        io_(io),
        reads_(reads),
        factory_(factory),
        recycled_(std::move(recycled)),
        stats_(stats) {}

  // A forked child's fresh pool (see OwnedPlacement::replace_pool).
  void replace_pool(std::shared_ptr<pool::RecycledBlocks> recycled) {
    recycled_ = std::move(recycled);
  }
  // The whole tensor `t`, on the target device (a host-fallback tensor over the budget: on the
  // host). Throws Error naming the file and the tensor on a read failure or a file changed since
  // open.
  at::Tensor tensor(const format::IndexedTensor& t);
  // Rows [start, stop) of `t` along its first dimension: only their bytes are read. A 0-d tensor
  // or rows outside [0, rows) are Error(Argument).
  at::Tensor rows(const format::IndexedTensor& t, int64_t start, int64_t stop);

 private:
  // Reads [offset, offset + nbytes) of `t` into a fresh owned storage, synchronously (a view of
  // the mapping with the mmap backend and a host target).
  c10::intrusive_ptr<c10::StorageImpl> read(const format::IndexedTensor& t, uint64_t offset,
                                            uint64_t nbytes);
  at::Tensor to_target(at::Tensor tensor) const;

  const PassPlan& plan_;
  const plan::LoadMode& mode_;
  c10::Device target_;
  const uint64_t device_budget_;  // the budget in force (agreed by the group)
  io::IoSetup& io_;
  ReadScheduler& reads_;
  TensorFactory& factory_;
  std::shared_ptr<pool::RecycledBlocks> recycled_;
  Stats& stats_;
};

}  // namespace instanttensor::loader

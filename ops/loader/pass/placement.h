// Placement: where each read group of a pass lands until it is handed out. Owned placement reads
// each tensor into storage of its own, ahead of the consumer within a byte bound; ring
// placement puts groups into a borrow ring and hands out views with safe borrowing. Host or
// device memory is a constructor argument. Consumer thread only.
#pragma once

#include <memory>

#include "instanttensor/instanttensor.h"
#include "loader/pass/pass_state.h"
#include "loader/transfer/borrow_ring.h"
#include "loader/transfer/device_stage.h"
#include "pool/recycled_blocks.h"

namespace instanttensor::loader {

class Placement {
 public:
  virtual ~Placement() = default;
  // Gives group `g` of `pass` its destination: sets `dest` and `placed` in its state and the
  // items' storages. Returns false when there is no room until the consumer moves on; `force`
  // makes room anyway (above the read-ahead bound, or copying out the tensor handed out last).
  // Precondition: the group has bytes (`length` > 0) and its `range` is set.
  virtual bool place(size_t g, PassState& pass, bool force) = 0;
};

// Each group holds one tensor, read into its own storage (host: a recycled block with the
// O_DIRECT widening outside the tensor; device: a fresh device allocation). At most `bound`
// bytes are allocated ahead of the consumer, unless forced.
class OwnedPlacement : public Placement {
 public:
  // `plan`, `stage` (device memory only) and `stats` outlive this object; host memory comes
  // from `recycled`.
  OwnedPlacement(const PassPlan& plan, std::shared_ptr<pool::RecycledBlocks> recycled,
                 const DeviceStage* stage, uint64_t bound, Stats& stats)
      : plan_(plan), recycled_(std::move(recycled)), stage_(stage), bound_(bound), stats_(stats) {}
  bool place(size_t g, PassState& pass, bool force) override;
  // A forked child's fresh pool (a parent thread may have held the old one's lock at the fork).
  void replace_pool(std::shared_ptr<pool::RecycledBlocks> recycled) {
    recycled_ = std::move(recycled);
  }

 private:
  const PassPlan& plan_;
  std::shared_ptr<pool::RecycledBlocks> recycled_;
  const DeviceStage* stage_;  // null: host memory
  uint64_t bound_;
  Stats& stats_;
};

// Groups placed in a borrow ring, oldest released first: a region is reused once the consumer
// has moved past its tensors (safe borrowing copies out the ones it still holds).
class RingPlacement : public Placement {
 public:
  // `ring` (host or device memory) outlives this object. `padding`: bytes past each group the
  // exchange may write (equal rank slices; 0 without one).
  RingPlacement(const PassPlan& plan, BorrowRing& ring, uint64_t padding, Stats& stats)
      : plan_(plan), ring_(ring), padding_(padding), stats_(stats) {}
  bool place(size_t g, PassState& pass, bool force) override;
  // Device rings: the consumer asked for the next tensor, so its work on every tensor handed out
  // so far is queued; marks each region it has moved past as released at this point.
  void release_consumed(const PassState& pass);

 private:
  bool reclaim_oldest(const PassState& pass, bool force);

  const PassPlan& plan_;
  BorrowRing& ring_;
  uint64_t padding_;
  Stats& stats_;
};

}  // namespace instanttensor::loader

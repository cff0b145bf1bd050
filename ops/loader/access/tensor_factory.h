// Making the tensors a loader hands out: owned, borrowed (a view of a ring region), mapped (a view
// of the file mapping) or empty, with the dtype and shape of the file resolved in one place.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>

#include <memory>
#include <vector>

#include "format/checkpoint.h"
#include "instanttensor/instanttensor.h"
#include "io/mapped_files.h"
#include "loader/transfer/device_stage.h"

namespace instanttensor::loader {

// The torch dtype and shape of a tensor of the file.
struct TensorSpec {
  c10::ScalarType dtype;
  std::vector<int64_t> shape;
};

class TensorFactory {
 public:
  // `stage`: the transfer stage for owned copies of device tensors (null: host targets only).
  // `stats`: where copies are booked. Both outlive the factory. Consumer thread.
  TensorFactory(const format::Checkpoint& checkpoint, const DeviceStage* stage, Stats& stats)
      : checkpoint_(checkpoint), stage_(stage), stats_(stats) {}

  // The dtype and shape torch sees. A dtype torch lacks (F6) or an F4 shape with no torch layout
  // is Error(Format) naming the file and the tensor.
  TensorSpec spec(const format::IndexedTensor& t) const;
  // A tensor of `spec` over `storage` (which it then owns a reference to).
  static at::Tensor over(c10::intrusive_ptr<c10::StorageImpl> storage, const TensorSpec& spec);
  // An empty tensor (no bytes) of `t` on `device`.
  at::Tensor empty(const format::IndexedTensor& t, c10::Device device) const;
  // A storage viewing [offset, offset + nbytes) of `t` in `mapping`, keeping the mapping alive.
  c10::intrusive_ptr<c10::StorageImpl> mapped(const std::shared_ptr<const io::MappedFiles>& mapping,
                                              const format::IndexedTensor& t, uint64_t offset,
                                              uint64_t nbytes) const;
  // `tensor` (of `t`) itself when its data is aligned for its element type, else an aligned
  // owned copy (element-wise kernels may not expect a misaligned pointer; the file may hold one).
  at::Tensor aligned(at::Tensor tensor, const format::IndexedTensor& t);
  // A copy of `tensor` (of `t`) in fresh memory of its device (host: the kernel's copy, so a
  // view of a file truncated meanwhile is Error(Io) naming the file and `t`, never a SIGBUS;
  // device: queued on the consumer's stream through the stage), booked as copy time.
  at::Tensor owned_copy(const at::Tensor& tensor, const format::IndexedTensor& t);

 private:
  at::Tensor copy_of(const at::Tensor& tensor, const format::IndexedTensor& t) const;

  const format::Checkpoint& checkpoint_;
  const DeviceStage* stage_;
  Stats& stats_;
};

}  // namespace instanttensor::loader

#include "loader/access/random_access.h"

#include <c10/util/ScopeExit.h>

#include "loader/reads/read_tags.h"
#include "loader/reads/timing.h"
#include "loader/transfer/storage_views.h"

namespace instanttensor::loader {

at::Tensor RandomAccess::tensor(const format::IndexedTensor& t) {
  auto spec = factory_.spec(t);
  auto storage = read(t, 0, t.nbytes);
  stats_.tensors_loaded += 1;
  return to_target(factory_.aligned(TensorFactory::over(std::move(storage), spec), t));
}

at::Tensor RandomAccess::rows(const format::IndexedTensor& t, int64_t start, int64_t stop) {
  const std::string& file = plan_.file_of(t);
  auto spec = factory_.spec(t);
  if (spec.shape.empty()) {
    throw Error(ErrorKind::Argument, file, t.name(), "a 0-d tensor has no rows to slice");
  }
  int64_t rows = spec.shape[0];
  if (start < 0 || stop < start || stop > rows) {
    throw Error(ErrorKind::Argument, file, t.name(),
                "rows [" + std::to_string(start) + ", " + std::to_string(stop) +
                    ") are outside [0, " + std::to_string(rows) + ")");
  }
  uint64_t row_bytes = rows == 0 ? 0 : t.nbytes / static_cast<uint64_t>(rows);
  spec.shape[0] = stop - start;
  // Rows are contiguous in a row-major file: only their byte range is read.
  auto storage = read(t, static_cast<uint64_t>(start) * row_bytes,
                      static_cast<uint64_t>(stop - start) * row_bytes);
  return to_target(factory_.aligned(TensorFactory::over(std::move(storage), spec), t));
}

c10::intrusive_ptr<c10::StorageImpl> RandomAccess::read(const format::IndexedTensor& t,
                                                        uint64_t offset, uint64_t nbytes) {
  plan_.checkpoint->check_unchanged(t.file_index, t.name());
  if (mode_.mapped_access) return factory_.mapped(io_.mapping(), t, offset, nbytes);
  auto range = plan::align_range(t.file_offset + offset, nbytes, plan_.io_alignment);
  auto window =
      recycled_->allocate_window(range.span, range.prefix, plan_.ring_alignment, "a tensor");
  auto* dest = static_cast<uint8_t*>(window.get()) - range.prefix;
  auto storage = make_owned_storage(std::move(window), nbytes);
  // After the check below (by the descriptor while held), unless the pass is reading it too;
  // on an error after settle() below, so nothing of this read is in flight any more.
  auto release = c10::make_scope_exit([&] { reads_.release_if_idle(t.file_index); });
  std::optional<ReadFailure> failure;
  try {
    reads_.submit(t.file_index, range, dest, read_tags::kRandomAccess);
    // Reads of the pass may complete in between; they stay booked for the pass.
    auto start = Clock::now();
    failure = reads_.wait_for(read_tags::kRandomAccess);
    stats_.wait_seconds += seconds_since(start);
  } catch (...) {
    // Pieces queued before a later one failed still write into `storage`: none may land after
    // it is freed below.
    reads_.settle(read_tags::kRandomAccess);
    throw;
  }
  if (failure) throw read_failure_error(*failure, plan_.file_of(t), t.name());
  plan_.checkpoint->check_unchanged(t.file_index, t.name());  // written in place meanwhile?
  return storage;
}

at::Tensor RandomAccess::to_target(at::Tensor tensor) const {
  if (!mode_.moves_to_target(tensor.nbytes(), device_budget_)) return tensor;
  // One tensor at a time, in its own host storage: a plain copy suffices.
  return tensor.to(target_);
}

}  // namespace instanttensor::loader

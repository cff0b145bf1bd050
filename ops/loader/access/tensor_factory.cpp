#include "loader/access/tensor_factory.h"

#include "format/torch_dtype.h"
#include "io/fault_free_copy.h"
#include "loader/reads/timing.h"
#include "loader/transfer/storage_views.h"
#include "pool/host_buffer.h"

namespace instanttensor::loader {

TensorSpec TensorFactory::spec(const format::IndexedTensor& t) const {
  const std::string& file = checkpoint_.files()[t.file_index].path;
  return TensorSpec{format::to_torch_dtype(t.entry->dtype, file, t.name()),
                    format::to_torch_shape(*t.entry, file)};
}

at::Tensor TensorFactory::over(c10::intrusive_ptr<c10::StorageImpl> storage,
                               const TensorSpec& spec) {
  return tensor_over(std::move(storage), spec.dtype, spec.shape);
}

at::Tensor TensorFactory::empty(const format::IndexedTensor& t, c10::Device device) const {
  return over(make_owned_storage(c10::DataPtr(nullptr, device), 0), spec(t));
}

c10::intrusive_ptr<c10::StorageImpl> TensorFactory::mapped(
    const std::shared_ptr<const io::MappedFiles>& mapping, const format::IndexedTensor& t,
    uint64_t offset, uint64_t nbytes) const {
  return make_storage_kept_by(mapping->data(t.file_index) + t.file_offset + offset, nbytes,
                              mapping);
}

at::Tensor TensorFactory::aligned(at::Tensor tensor, const format::IndexedTensor& t) {
  if (reinterpret_cast<uintptr_t>(tensor.data_ptr()) % tensor.element_size() == 0) return tensor;
  at::Tensor copy = owned_copy(tensor, t);
  stats_.misaligned_copies += 1;
  return copy;
}

at::Tensor TensorFactory::owned_copy(const at::Tensor& tensor, const format::IndexedTensor& t) {
  auto start = Clock::now();
  at::Tensor copy = copy_of(tensor, t);
  stats_.copy_seconds += seconds_since(start);
  return copy;
}

at::Tensor TensorFactory::copy_of(const at::Tensor& tensor, const format::IndexedTensor& t) const {
  uint64_t nbytes = tensor.nbytes();
  const auto* from = static_cast<const uint8_t*>(tensor.data_ptr());
  c10::DataPtr fresh;
  if (tensor.device().is_cpu()) {
    fresh = pool::allocate_host(nbytes, false, "a tensor");
    // A view of a file mapping: a page past a truncation stops the kernel's copy, no SIGBUS.
    if (io::copy_without_faults(fresh.get(), from, nbytes) < nbytes) {
      throw Error(ErrorKind::Io, checkpoint_.files()[t.file_index].path, t.name(),
                  "file shrank during the load (its mapping ends before the tensor)");
    }
  } else {
    fresh = stage_->copy_on_device(from, nbytes);
  }
  return tensor_over(make_owned_storage(std::move(fresh), nbytes), tensor.scalar_type(),
                     tensor.sizes().vec());
}

}  // namespace instanttensor::loader

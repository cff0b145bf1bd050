#include "loader/transfer/storage_views.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>

namespace instanttensor::loader {

c10::intrusive_ptr<c10::StorageImpl> make_storage(c10::DataPtr data, uint64_t nbytes) {
  return c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(),
                                               static_cast<int64_t>(nbytes), std::move(data),
                                               /*allocator=*/nullptr, /*resizable=*/false);
}

c10::intrusive_ptr<c10::StorageImpl> make_owned_storage(c10::DataPtr data, uint64_t nbytes) {
  if (!data.device().is_cpu()) return make_storage(std::move(data), nbytes);
  return c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(),
                                               static_cast<int64_t>(nbytes), std::move(data),
                                               c10::GetCPUAllocator(), /*resizable=*/true);
}

c10::DataPtr data_kept_by(void* data, std::shared_ptr<const void> owner) {
  auto* keep = new std::shared_ptr<const void>(std::move(owner));
  return c10::DataPtr(
      data, keep, [](void* context) { delete static_cast<std::shared_ptr<const void>*>(context); },
      c10::Device(c10::DeviceType::CPU));
}

c10::intrusive_ptr<c10::StorageImpl> make_storage_kept_by(uint8_t* data, uint64_t nbytes,
                                                          std::shared_ptr<const void> owner) {
  return make_storage(data_kept_by(data, std::move(owner)), nbytes);
}

at::Tensor tensor_over(c10::intrusive_ptr<c10::StorageImpl> storage, c10::ScalarType dtype,
                       const std::vector<int64_t>& shape) {
  auto keys =
      c10::DispatchKeySet(c10::computeDispatchKey(std::nullopt, at::kStrided, storage->device()));
  auto tensor = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(std::move(storage)), keys,
                                                         c10::scalarTypeToTypeMeta(dtype));
  tensor.unsafeGetTensorImpl()->set_sizes_contiguous(shape);
  return tensor;
}

at::Tensor byte_view(uint8_t* data, uint64_t nbytes, c10::Device device) {
  return tensor_over(make_storage(c10::DataPtr(data, device), nbytes), at::kByte,
                     {static_cast<int64_t>(nbytes)});
}

}  // namespace instanttensor::loader

#include "loader/device_stage.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "instanttensor/error.h"

namespace instanttensor::loader {

namespace {
constexpr uint64_t kDeviceAlignment = 256;  // what device allocators hand out

bool has_events(c10::DeviceType type) { return type != c10::DeviceType::CPU; }

const c10::impl::DeviceGuardImplInterface* guard_impl(c10::DeviceType type) {
  return c10::impl::getDeviceGuardImpl(type);
}

at::Tensor tensor_over(c10::intrusive_ptr<c10::StorageImpl> storage, const at::Tensor& like) {
  auto keys =
      c10::DispatchKeySet(c10::computeDispatchKey(std::nullopt, at::kStrided, storage->device()));
  auto tensor = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(std::move(storage)), keys,
                                                         like.dtype());
  tensor.unsafeGetTensorImpl()->set_sizes_contiguous(like.sizes());
  return tensor;
}
}  // namespace

DeviceStage::DeviceStage(c10::Device device, bool copy, uint64_t ring_bytes)
    : device_(device),
      copy_(copy),
      ring_bytes_(ring_bytes),
      loader_stream_(has_events(device.type())
                         ? guard_impl(device.type())->getStreamFromGlobalPool(device)
                         : c10::Stream(c10::Stream::DEFAULT, device)) {}

DeviceStage::~DeviceStage() {
  try {
    close();
  } catch (...) {
    // Only a device allocation failure while copying out retained tensors can land here.
  }
}

c10::Stream DeviceStage::consumer_stream() const {
  return has_events(device_.type()) ? guard_impl(device_.type())->getStream(device_)
                                    : c10::Stream(c10::Stream::DEFAULT, device_);
}

at::Tensor DeviceStage::transfer(const at::Tensor& staged, CopyFence* staging_free) {
  c10::DeviceGuard device_guard(device_);
  const c10::Stream consumer = consumer_stream();
  at::Tensor target;
  if (copy_ || staged.nbytes() == 0) {
    // Allocated while the consumer's stream is current: the caching allocator ties the block
    // to the stream that will use it.
    target = at::empty(staged.sizes(), staged.options().device(device_));
  } else {
    uint64_t size = staged.nbytes();
    if (size + kDeviceAlignment > ring_bytes_) {
      throw Error(ErrorKind::Argument, "", "",
                  "tensor of " + std::to_string(size) +
                      " bytes does not fit the device buffer of " + std::to_string(ring_bytes_) +
                      " bytes");
    }
    if (!allocator_) {
      ring_ = at::empty({static_cast<int64_t>(ring_bytes_)},
                        at::TensorOptions().dtype(at::kByte).device(device_));
      allocator_ = std::make_unique<pool::RingAllocator>(ring_bytes_, kDeviceAlignment);
    }
    std::optional<uint64_t> at;
    while (!(at = allocator_->allocate(size, 0))) {
      bool force =
          std::all_of(regions_.begin(), regions_.end(), [](const Region& r) { return r.live; });
      reclaim_oldest(force);
    }
    auto* ptr = static_cast<uint8_t*>(ring_.data_ptr()) + *at;
    auto storage = c10::make_intrusive<c10::StorageImpl>(
        c10::StorageImpl::use_byte_size_t(), static_cast<int64_t>(size), c10::DataPtr(ptr, device_),
        /*allocator=*/nullptr, /*resizable=*/false);
    for (auto& region : regions_) region.live = false;
    regions_.push_back(Region{storage, true, size});
    in_use_ += size;
    peak_ = std::max(peak_, in_use_);
    target = tensor_over(storage, staged);
  }
  {
    c10::StreamGuard stream_guard(loader_stream_);
    if (target.nbytes() > 0) {
      target.copy_(staged, /*non_blocking=*/true);
    }
  }
  CopyFence copied = CopyFence::after(loader_stream_);
  copied.block(consumer);  // the consumer sees complete data, and the host never waits
  *staging_free = copied;
  return target;
}

void DeviceStage::materialize(Region& region) {
  // Fresh device memory, filled after the consumer's release point, then the storage repointed:
  // views of the kept tensor follow it.
  c10::DeviceGuard device_guard(device_);
  auto fresh = c10::GetAllocator(device_.type())->allocate(region.size);
  at::Tensor destination = at::from_blob(fresh.get(), {static_cast<int64_t>(region.size)},
                                         at::TensorOptions().dtype(at::kByte).device(device_));
  at::Tensor source =
      at::from_blob(region.storage->mutable_data(), {static_cast<int64_t>(region.size)},
                    at::TensorOptions().dtype(at::kByte).device(device_));
  {
    c10::StreamGuard stream_guard(loader_stream_);
    destination.copy_(source, /*non_blocking=*/true);  // after the release point (reclaim)
  }
  CopyFence::after(loader_stream_).block(consumer_stream());
  region.storage->set_data_ptr_noswap(std::move(fresh));
  materializations_ += 1;
}

void DeviceStage::reclaim_oldest(bool force) {
  if (regions_.empty()) {
    throw Error(ErrorKind::Io, "", "", "internal: the device buffer is full with nothing in it");
  }
  Region& oldest = regions_.front();
  if (oldest.live && !force) {
    throw Error(ErrorKind::Io, "", "", "internal: the live tensor blocks the device buffer");
  }
  // The release point: everything the consumer has queued so far (it is inside next() now).
  // The loader's stream waits for it before copying out or overwriting the region; the host
  // does not.
  CopyFence::after(consumer_stream()).block(loader_stream_);
  if (oldest.storage.use_count() > 1) materialize(oldest);
  in_use_ -= oldest.size;
  regions_.pop_front();
  allocator_->release_oldest();
}

void DeviceStage::close() {
  if (!regions_.empty()) CopyFence::after(consumer_stream()).block(loader_stream_);
  while (!regions_.empty()) {
    if (regions_.front().storage.use_count() > 1) materialize(regions_.front());
    in_use_ -= regions_.front().size;
    regions_.pop_front();
    if (allocator_) allocator_->release_oldest();
  }
  // The ring goes back to the caching allocator, which orders its reuse on the consumer's
  // stream; copies into it ran on the loader's stream, so join them first.
  if (ring_.defined()) {
    CopyFence::after(loader_stream_).block(consumer_stream());
    ring_ = at::Tensor();
  }
  allocator_.reset();
}

}  // namespace instanttensor::loader

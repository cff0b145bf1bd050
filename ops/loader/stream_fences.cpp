#include "loader/stream_fences.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace instanttensor::loader {

namespace {
bool device_has_events(c10::DeviceType type) { return type != c10::DeviceType::CPU; }
}  // namespace

CopyFence CopyFence::after(const c10::Stream& stream) {
  CopyFence fence;
  if (device_has_events(stream.device_type())) {
    fence.event_ = std::make_shared<c10::Event>(stream.device_type());
    fence.event_->record(stream);
  }
  return fence;
}

void CopyFence::wait() const {
  if (event_) event_->synchronize();
}

void CopyFence::block(const c10::Stream& stream) const {
  if (event_) event_->block(stream);
}

LoaderStreams::LoaderStreams(c10::Device device)
    : device_(device),
      loader_(device_has_events(device.type())
                  ? c10::impl::getDeviceGuardImpl(device.type())->getStreamFromGlobalPool(device)
                  : c10::Stream(c10::Stream::DEFAULT, device)) {}

bool LoaderStreams::has_events() const { return device_has_events(device_.type()); }

c10::Stream LoaderStreams::consumer() const {
  return has_events() ? c10::impl::getDeviceGuardImpl(device_.type())->getStream(device_)
                      : c10::Stream(c10::Stream::DEFAULT, device_);
}

void LoaderStreams::record_on_loader(const c10::DataPtr& data) const {
  if (has_events() && data.get() != nullptr) {
    c10::impl::getDeviceGuardImpl(device_.type())->recordDataPtrOnStream(data, loader_);
  }
}

}  // namespace instanttensor::loader

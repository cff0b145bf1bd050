#include "loader/transfer/stream_fences.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstdlib>
#include <string>

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

#ifdef INSTANTTENSOR_TESTING_HOOKS
namespace {
// Read when the library is loaded (before a test harness may clear INSTANTTENSOR_* variables).
const std::string dropped_fence = [] {
  const char* value = std::getenv("INSTANTTENSOR_TESTING_DROP_FENCE");
  return std::string(value == nullptr ? "" : value);
}();
}  // namespace

bool fence_dropped(const char* site) { return !dropped_fence.empty() && dropped_fence == site; }
#else
bool fence_dropped(const char*) { return false; }  // a release build drops no fence
#endif

void CopyFence::wait(const char* site) const {
  if (event_ && !fence_dropped(site)) event_->synchronize();
}

bool CopyFence::passed(const char* site) const {
  return !event_ || fence_dropped(site) || event_->query();
}

void CopyFence::block(const c10::Stream& stream, const char* site) const {
  if (event_ && !fence_dropped(site)) event_->block(stream);
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

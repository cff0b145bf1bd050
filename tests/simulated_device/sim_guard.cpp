// The simulated device's DeviceGuardImpl: current device and stream per thread, pool streams,
// events as positions on a stream, recordDataPtrOnStream.
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "sim_allocators.h"
#include "sim_runtime.h"

namespace simdev {
namespace {

constexpr auto kType = c10::DeviceType::PrivateUse1;

struct GuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device device) const override {
    c10::Device previous = getDevice();
    setDevice(device);
    return previous;
  }
  c10::Device getDevice() const override { return c10::Device(kType, current_device()); }
  void setDevice(c10::Device device) const override {
    if (device.index() >= 0) set_current_device(device.index());
  }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.index() >= 0 && device.index() < kDeviceCount) set_current_device(device.index());
  }
  c10::Stream getStream(c10::Device device) const override {
    return current_stream(device.index() < 0 ? current_device() : device.index());
  }
  c10::Stream getDefaultStream(c10::Device device) const override {
    return stream(device.index() < 0 ? current_device() : device.index(), 0).handle();
  }
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool = false) const override {
    return pool_stream(device.index() < 0 ? current_device() : device.index());
  }
  c10::Stream getNewStream(c10::Device device, int = 0) const override {
    return new_stream(device.index() < 0 ? current_device() : device.index());
  }
  c10::Stream exchangeStream(c10::Stream s) const override { return exchange_current_stream(s); }
  c10::DeviceIndex deviceCount() const noexcept override { return kDeviceCount; }

  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<Event*>(event);
  }
  void record(void** event, const c10::Stream& s, const c10::DeviceIndex,
              const c10::EventFlag) const override {
    if (*event == nullptr) *event = new Event();
    auto* e = static_cast<Event*>(*event);
    e->stream = &stream_of(s);
    e->sequence = e->stream->enqueue([] {});
  }
  void block(void* event, const c10::Stream& s) const override {
    auto* e = static_cast<Event*>(event);
    if (e == nullptr || e->stream == nullptr) return;
    Stream* recorded = e->stream;
    uint64_t sequence = e->sequence;
    if (recorded == &stream_of(s)) return;  // a stream is ordered with itself
    stream_of(s).enqueue([recorded, sequence] { recorded->wait_for(sequence); });
  }
  bool queryEvent(void* event) const override {
    auto* e = static_cast<Event*>(event);
    bool done = e == nullptr || e->stream == nullptr || e->stream->passed(e->sequence);
    if (!done) count_pending_poll();
    return done;
  }
  void synchronizeEvent(void* event) const override {
    auto* e = static_cast<Event*>(event);
    if (e != nullptr && e->stream != nullptr) e->stream->wait_for(e->sequence);
  }
  bool queryStream(const c10::Stream& s) const override {
    auto& target = stream_of(s);
    bool done = target.passed(target.enqueued());
    if (!done) count_pending_poll();
    return done;
  }
  void synchronizeStream(const c10::Stream& s) const override { stream_of(s).synchronize(); }
  void synchronizeDevice(const c10::DeviceIndex device) const override {
    for (int id = 0; id < kStreamsPerDevice; ++id) stream(device, id).synchronize();
  }
  void recordDataPtrOnStream(const c10::DataPtr& data, const c10::Stream& s) const override {
    record_block_use(data, s);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

}  // namespace
}  // namespace simdev

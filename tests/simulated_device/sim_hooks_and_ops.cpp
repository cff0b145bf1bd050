// The simulated device's PrivateUse1 hooks (pinned memory, availability) and the operators the
// Python tests use to drive and inspect it: torch.ops.simdev.*.
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <torch/library.h>

#include <chrono>
#include <thread>
#include <tuple>

#include "sim_allocators.h"
#include "sim_runtime.h"

namespace simdev {
namespace {

struct Hooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  c10::DeviceIndex deviceCount() const override { return kDeviceCount; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  bool isPinnedPtr(const void* data) const override { return is_pinned(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override {
    return at::getHostAllocator(at::kPrivateUse1);
  }
  at::Device getDeviceFromPtr(void*) const override {
    return at::Device(c10::DeviceType::PrivateUse1, current_device());
  }
};

const bool hooks_registered = [] {
  at::RegisterPrivateUse1HooksInterface(new Hooks());
  return true;
}();

std::tuple<int64_t, int64_t> mem_get_info(int64_t device) {
  auto used = device_bytes_in_use(static_cast<c10::DeviceIndex>(device));
  return {static_cast<int64_t>(kDeviceCapacity - std::min(used, kDeviceCapacity)),
          static_cast<int64_t>(kDeviceCapacity)};
}

void synchronize(int64_t device) {
  for (int id = 0; id < kStreamsPerDevice; ++id) {
    stream(static_cast<c10::DeviceIndex>(device), id).synchronize();
  }
}

}  // namespace

TORCH_LIBRARY(simdev, m) {
  m.def("set_delays(bool on) -> ()", [](bool on) { set_delays(on); });
  m.def("delays() -> bool", [] { return delays(); });
  m.def("pinned_bytes() -> int", [] { return static_cast<int64_t>(pinned_bytes_in_use()); });
  m.def("set_pinned_limit(int bytes) -> ()", [](int64_t bytes) { set_pinned_limit(bytes); });
  m.def("device_bytes(int device) -> int", [](int64_t device) {
    return static_cast<int64_t>(device_bytes_in_use(static_cast<c10::DeviceIndex>(device)));
  });
  m.def("mem_get_info(int device) -> (int, int)", &mem_get_info);
  m.def("synchronize(int device) -> ()", &synchronize);
  // A slow kernel on the device's current stream (torch.cuda._sleep's counterpart).
  m.def("sleep(int device, int micros) -> ()", [](int64_t device, int64_t micros) {
    auto& s = stream_of(current_stream(static_cast<c10::DeviceIndex>(device)));
    s.enqueue([micros] { std::this_thread::sleep_for(std::chrono::microseconds(micros)); });
  });
  // Stalls every pool stream (where the loader's stream comes from): what the loader queues
  // next runs at least `micros` later, while the consumer's streams stay idle.
  m.def("stall_pool_streams(int device, int micros) -> ()", [](int64_t device, int64_t micros) {
    for (int id = 1; id <= kPoolStreams; ++id) {
      stream(static_cast<c10::DeviceIndex>(device), id).enqueue([micros] {
        std::this_thread::sleep_for(std::chrono::microseconds(micros));
      });
    }
  });
  // The timing model (sim_runtime.h): bandwidths in GB/s (0: off), latency in microseconds.
  m.def("set_timing(float h2d_gbps, float d2h_gbps, float latency_us) -> ()",
        [](double h2d, double d2h, double latency_us) {
          set_timing(Timing{h2d * 1e9, d2h * 1e9, latency_us * 1e-6});
        });
  m.def("timing() -> (float, float, float)", [] {
    Timing t = timing();
    return std::make_tuple(t.h2d_bytes_per_second / 1e9, t.d2h_bytes_per_second / 1e9,
                           t.latency_seconds * 1e6);
  });
  m.def("set_move_bytes(bool on) -> ()", [](bool on) { set_move_bytes(on); });
  // (host waits, host syncs, pending polls, workers' CPU s, host threads' CPU s waking them)
  // since the process started (sim_runtime.h): read before and after a phase.
  m.def("counters() -> (int, int, int, float, float)", [] {
    Counters c = counters();
    return std::make_tuple(static_cast<int64_t>(c.host_waits), static_cast<int64_t>(c.host_syncs),
                           static_cast<int64_t>(c.pending_polls), c.worker_cpu_seconds,
                           c.wake_cpu_seconds);
  });
  m.def("reset_peaks() -> ()", [] { reset_peaks(); });
  m.def("stale_accesses() -> int", [] { return static_cast<int64_t>(stale_accesses()); });
  // (copies, busy seconds, first start, last end) of the host-to-device engine (h2d true) or
  // the device-to-host one, since reset_engine_stats (sim_runtime.h).
  m.def("engine_stats(int device, bool h2d) -> (int, float, float, float)",
        [](int64_t device, bool h2d) {
          EngineStats e = engine_stats(static_cast<c10::DeviceIndex>(device),
                                       h2d ? Direction::HostToDevice : Direction::DeviceToHost);
          return std::make_tuple(static_cast<int64_t>(e.copies), e.busy_seconds, e.first_start,
                                 e.last_end);
        });
  // Each copy of that engine since reset_engine_stats, flattened: start, end, bytes, ...
  m.def("engine_log(int device, bool h2d) -> float[]", [](int64_t device, bool h2d) {
    std::vector<double> flat;
    for (const auto& copy : engine_log(static_cast<c10::DeviceIndex>(device),
                                       h2d ? Direction::HostToDevice : Direction::DeviceToHost)) {
      flat.insert(flat.end(), {copy.start, copy.end, static_cast<double>(copy.bytes)});
    }
    return flat;
  });
  m.def("reset_engine_stats() -> ()", [] { reset_engine_stats(); });
  m.def("device_bytes_peak(int device) -> int", [](int64_t device) {
    return static_cast<int64_t>(device_bytes_peak(static_cast<c10::DeviceIndex>(device)));
  });
  m.def("pinned_bytes_peak() -> int", [] { return static_cast<int64_t>(pinned_bytes_peak()); });
  m.def("current_device() -> int", [] { return static_cast<int64_t>(current_device()); });
  m.def("set_device(int device) -> ()",
        [](int64_t device) { set_current_device(static_cast<c10::DeviceIndex>(device)); });
}

}  // namespace simdev

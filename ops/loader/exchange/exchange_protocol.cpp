#include "loader/exchange/exchange_protocol.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/ScopeExit.h>

#include "loader/reads/timing.h"
#include "loader/transfer/storage_views.h"

namespace instanttensor::loader {

uint64_t layout_digest(const format::Checkpoint& checkpoint, const std::vector<size_t>& selected,
                       const LayoutOptions& options) {
  uint64_t hash = 1469598103934665603ull;
  auto mix = [&](const void* data, size_t size) {
    for (size_t i = 0; i < size; ++i) {
      hash = (hash ^ static_cast<const uint8_t*>(data)[i]) * 1099511628211ull;
    }
  };
  auto mix_value = [&](uint64_t value) { mix(&value, sizeof(value)); };
  for (const auto& file : checkpoint.files()) {
    mix_value(file.size);
    mix_value(file.header.header_length);
  }
  for (size_t index : selected) {
    const auto& t = checkpoint.tensors()[index];
    mix(t.name().data(), t.name().size());
    mix_value(t.file_offset);
    mix_value(t.nbytes);
  }
  mix_value(options.copy);
  mix_value(options.buffer_size);
  mix_value(options.chunk_size);
  mix_value(options.staging_size);
  mix_value(options.host_fallback);
  mix_value(options.staged);
  mix_value(static_cast<uint64_t>(options.device_type));
  mix_value(static_cast<uint64_t>(options.exchange));
  return hash;
}

ExchangeProtocol::ExchangeProtocol(c10::intrusive_ptr<c10d::ProcessGroup> group, c10::Device where,
                                   uint64_t digest, uint64_t host_identity, uint64_t device_budget,
                                   const std::string& file)
    : exchange_(std::move(group), where) {
  auto agreed = exchange_.handshake(digest, device_budget, host_identity, file);
  agreed_device_budget_ = agreed.device_budget;
  topology_ = host_topology(agreed.host_identities, exchange_.rank());
}

void ExchangeProtocol::status_round(const std::optional<Error>& failure, const std::string& file,
                                    Stats& stats) {
  auto start = Clock::now();
  exchange_.check_statuses(failure, file);
  stats.exchange_seconds += seconds_since(start);
}

void ExchangeProtocol::post_status(const std::optional<Error>& failure, Stats& stats) {
  auto start = Clock::now();
  exchange_.post_status(failure);
  stats.exchange_seconds += seconds_since(start);
}

void ExchangeProtocol::settle_status(const std::string& file, Stats& stats) {
  auto start = Clock::now();
  auto count = c10::make_scope_exit([&] { stats.exchange_seconds += seconds_since(start); });
  exchange_.settle_status(file);
}

uint64_t ExchangeProtocol::gather_unit(size_t g, size_t u, const PassPlan& plan,
                                       const GroupState& state, const c10::Stream* loader_stream) {
  auto unit = plan.memory.layout.unit(plan.reads.groups[g].length, u);
  const c10::Device device = exchange_.device();
  at::Tensor bytes = byte_view(state.dest + unit.begin, unit.slice * world(), device);
  if (loader_stream) {
    // After the copies of this rank's share, queued on the loader's stream.
    c10::DeviceGuard guard(device);
    c10::StreamGuard on_loader(*loader_stream);
    exchange_.gather(bytes);
  } else {
    exchange_.gather(bytes);
  }
  return unit.share_end(rank()) - unit.share_begin(rank());
}

}  // namespace instanttensor::loader

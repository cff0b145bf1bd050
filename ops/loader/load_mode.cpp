#include "loader/load_mode.h"

namespace instanttensor::loader {

LoadMode choose_load_mode(const LoadModeInputs& in) {
  LoadMode mode;
  mode.accelerator = in.accelerator_target;
  mode.staged = in.force_staging || in.accelerator_target;
  mode.host_fallback = mode.staged && in.host_fallback;
  if (in.distributed) {
    // The exchange needs a backend for the target's own device type; it gathers in the memory
    // the reads land in, so device bytes never bounce through the host.
    if (!in.group_serves_target) {
      mode.exchange_fell_back = true;
    } else {
      mode.exchange = mode.staged ? ExchangePlace::Device : ExchangePlace::Host;
    }
  }
  // The exchange gathers in place, so it always lands in a ring (copy=true: copied at hand-out).
  mode.ring = !in.copy || mode.exchanging();
  mode.mapped_access = in.mapping_backend && !mode.staged;
  mode.mapped_iteration = mode.mapped_access && !in.copy && !mode.exchanging();
  return mode;
}

Destination LoadMode::destination_of(uint64_t first_bytes, uint64_t device_budget) const {
  if (!staged) return ring ? Destination::HostRing : Destination::HostOwned;
  if (host_fallback && first_bytes > device_budget) return Destination::HostOwned;
  return ring ? Destination::DeviceRing : Destination::DeviceOwned;
}

bool LoadMode::uses_shares(Destination where) const {
  return where == Destination::DeviceRing || where == Destination::DeviceOwned ||
         (where == Destination::HostRing && exchanging());
}

bool LoadMode::moves_to_target(uint64_t nbytes, uint64_t device_budget) const {
  if (!accelerator) return false;
  return !(host_fallback && nbytes > device_budget);
}

}  // namespace instanttensor::loader

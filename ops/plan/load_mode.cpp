#include "plan/load_mode.h"

namespace instanttensor::plan {

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
      mode.reason = ExchangeReason::NoBackend;
    } else {
      mode.in_step = true;
      const ExchangePlace place = mode.staged ? ExchangePlace::Device : ExchangePlace::Host;
      switch (in.exchange_policy) {
        case ExchangePolicy::Always:
          mode.exchange = place;
          mode.reason = ExchangeReason::Forced;
          break;
        case ExchangePolicy::Never:
          mode.reason = ExchangeReason::Refused;
          break;
        case ExchangePolicy::Auto:
          // A device target exchanges: each rank copies 1/world over its own bus and the
          // device backend (NCCL on NVLink) moves the rest. A host target does not: ranks on
          // one host already share its page cache (the disk is read once for all of them
          // through buffered reads), so gloo would move every byte a second time (2 ranks,
          // 1 GB: 2.2x the time of reading alone, cold). Across hosts each rank reads
          // everything too: 2 hosts x 2 ranks measured faster reading alone than exchanging
          // (benchmarks/README.md), and a host target's bytes never cross a device bus.
          if (mode.staged) {
            mode.exchange = place;
            mode.reason = ExchangeReason::DeviceTarget;
          } else {
            mode.reason = in.hosts > 1 ? ExchangeReason::SeveralHosts : ExchangeReason::OneHost;
          }
          break;
      }
    }
  }
  // The exchange gathers in place, so it always lands in a ring (copy=true: copied at hand-out).
  mode.ring = !in.copy || mode.exchanging();
  mode.mapped_access = in.mapping_backend && !mode.staged;
  mode.mapped_iteration = mode.mapped_access && !in.copy && !mode.exchanging();
  // A host target that does not exchange reads nothing into memory of its own: the consumer
  // copies from the page cache once (its own copy), as with safetensors' mappings, instead of
  // the loader copying every byte into fresh memory that the consumer copies again (copy=true
  // measured 0.33x safetensors warm that way).
  // copy=false too: a view is borrowed until the iteration moves on, as the ring's are, and one
  // still held then is copied out, as the ring copies one whose memory it needs; no ring to
  // fill, no read into it (copy=false measured 0.52x safetensors warm through the ring). The
  // explicit mmap borrow keeps its views for life (mapped_iteration).
  mode.host_views =
      in.page_cache_views && !mode.staged && !mode.exchanging() && !mode.mapped_iteration;
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

std::string describe_exchange(const LoadMode& mode) {
  std::string place = mode.exchange == ExchangePlace::Host     ? "host"
                      : mode.exchange == ExchangePlace::Device ? "device"
                                                               : "none";
  const char* why = "";
  switch (mode.reason) {
    case ExchangeReason::SingleProcess:
      why = "single process";
      break;
    case ExchangeReason::NoBackend:
      why = "the group has no backend for the target";
      break;
    case ExchangeReason::OneHost:
      why = "one host, host target";
      break;
    case ExchangeReason::SeveralHosts:
      why = "several hosts, host target: each rank reads everything";
      break;
    case ExchangeReason::DeviceTarget:
      why = "device target";
      break;
    case ExchangeReason::Forced:
      why = "exchange=always";
      break;
    case ExchangeReason::Refused:
      why = "exchange=never";
      break;
  }
  place += " (";
  place += why;
  place += ')';
  return place;
}

bool LoadMode::moves_to_target(uint64_t nbytes, uint64_t device_budget) const {
  if (!accelerator) return false;
  return !(host_fallback && nbytes > device_budget);
}

}  // namespace instanttensor::plan

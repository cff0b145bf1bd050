// Resolving OpenOptions against the INSTANTTENSOR_* environment variables.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "instanttensor/instanttensor.h"
#include "plan/defaults.h"
#include "plan/load_mode.h"

namespace instanttensor::loader {

// Every option of an open after validation and environment lookup: the loader's only source of
// options. Sizes the checkpoint decides stay unset (0).
struct ResolvedOptions {
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  bool copy = true;
  std::optional<std::vector<std::string>> keys;
  uint64_t buffer_size = 0;  // 0: derive from the checkpoint
  uint64_t chunk_size = 0;
  int concurrency = 0;
  int io_depth = 0;
  std::vector<std::string> backends;                     // lower-case preference chain
  c10::intrusive_ptr<c10d::ProcessGroup> process_group;  // null: none
  plan::ExchangePolicy exchange = plan::ExchangePolicy::Auto;
  uint64_t staging_size = 0;  // 0: the default (staging_ring_bytes)
  // Staged targets only: as given, else free_share of the device's free memory at open
  // (default_device_budget), else unlimited.
  uint64_t device_budget = UINT64_MAX;
  double free_share = 0.5;  // max_free_mem_usage, parsed (free_memory_share)
  bool host_fallback = false;
  bool force_staging = false;
  bool print_warnings = true;
  bool debug = false;
  bool timeline = false;  // INSTANTTENSOR_TIMELINE=1: record the stages' events
};

// Explicit fields win over INSTANTTENSOR_BUFFER_SIZE, _CHUNK_SIZE, _CONCURRENCY, _IO_DEPTH,
// _BACKEND, _EXCHANGE, _DEBUG and _TIMELINE. A bad value (explicit or from the environment) is
// Error(Argument) naming the option or variable and the accepted values, whichever API opened (C++
// OpenOptions, the Loader class, Python). Any thread.
ResolvedOptions resolve_options(const OpenOptions& options);

// The share of an accelerator's free memory the loader may use: `given` (max_free_mem_usage),
// else INSTANTTENSOR_MAX_FREE_MEM_USAGE, else plan::defaults::kFreeMemoryShare. A value outside (0,
// 1] is Error(Argument) naming the option or variable. The one parse of both (the Python layer asks
// for it through torch.ops.instanttensor.free_memory_share). Any thread.
double free_memory_share(std::optional<double> given);

// Parses a byte count: a positive integer, optionally followed by K, M or G (powers of 1024).
// `what` names the option or variable in the error.
uint64_t parse_byte_size(const std::string& text, const std::string& what);

// The backend names this build knows, for error messages and validation.
const std::vector<std::string>& known_backend_names();

}  // namespace instanttensor::loader

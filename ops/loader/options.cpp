#include "loader/options.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <utility>

namespace instanttensor::loader {

namespace {

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

[[noreturn]] void bad(const std::string& what, const std::string& value,
                      const std::string& accepted) {
  throw Error(ErrorKind::Argument, "", "",
              what + "='" + value + "' is not valid; accepted: " + accepted);
}

// One rule for the explicit option and its variable: a positive integer (a byte count with an
// optional suffix when `byte_size`; else at most `max`).
uint64_t positive(std::optional<int64_t> explicit_value, const char* option, const char* variable,
                  bool byte_size, long long max = 1 << 20) {
  const std::string accepted =
      byte_size ? "a positive integer number of bytes, optionally with a K, M or G suffix"
                : "an integer from 1 to " + std::to_string(max);
  if (explicit_value) {
    if (*explicit_value <= 0 || (!byte_size && *explicit_value > max)) {
      bad(option, std::to_string(*explicit_value), accepted);
    }
    return static_cast<uint64_t>(*explicit_value);
  }
  auto text = env(variable);
  if (!text) return 0;
  if (byte_size) return parse_byte_size(*text, variable);
  char* end = nullptr;
  errno = 0;
  long long value = std::strtoll(text->c_str(), &end, 10);
  if (text->empty() || *end != '\0' || errno != 0 || value <= 0 || value > max ||
      !std::isdigit(static_cast<unsigned char>((*text)[0]))) {
    bad(variable, *text, accepted);
  }
  return static_cast<uint64_t>(value);
}

// Upstream InstantTensor's names that are not ours already, and the backend of ours that does
// the same job. URING, URING_BUFFERED and MMAP are our names too; BUFFERED (upstream's policy:
// page-cache reads) is our "buffered". CUFILE (GPUDirect Storage) is not built: see below.
const std::vector<std::pair<std::string, std::string>>& upstream_backend_names() {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"aio", "direct"},  // libaio + O_DIRECT upstream: our O_DIRECT pread pool
      {"aio_buffered", "buffered"},
  };
  return names;
}

std::string accepted_backends() {
  std::string accepted;
  for (const auto& name : known_backend_names()) accepted += name + ", ";
  return "a comma list of " + accepted +
         "or upstream's AIO, AIO_BUFFERED, URING, URING_BUFFERED, MMAP, CUFILE, BUFFERED (any "
         "case)";
}

std::string trimmed_lower(const std::string& text) {
  size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  size_t end = text.find_last_not_of(" \t");
  std::string name = text.substr(begin, end - begin + 1);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return name;
}

// A comma list of our names and upstream's, in any case, blanks around names and empty entries
// ignored (as upstream reads INSTANTTENSOR_BACKEND), mapped to our names in order. "cufile" is
// dropped (not built); a list with nothing else is an error, as upstream's "no available backend".
std::vector<std::string> parse_backends(const std::string& text, const std::string& what) {
  const auto& known = known_backend_names();
  std::vector<std::string> names;
  bool asked_for_cufile = false;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string name = trimmed_lower(
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    start = comma == std::string::npos ? text.size() + 1 : comma + 1;
    if (name.empty()) continue;
    if (name == "cufile") {
      asked_for_cufile = true;
      continue;
    }
    for (const auto& [upstream, ours] : upstream_backend_names()) {
      if (name == upstream) name = ours;
    }
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      bad(what, text, accepted_backends());
    }
    names.push_back(name);
  }
  if (names.empty() && asked_for_cufile) {
    throw Error(ErrorKind::Argument, "", "",
                what + "='" + text +
                    "' names no usable backend: CUFILE (GPUDirect Storage) is not built into "
                    "this instanttensor; add another candidate, e.g. 'CUFILE,AIO'");
  }
  if (names.empty()) bad(what, text, accepted_backends());
  return names;
}

plan::ExchangePolicy parse_exchange(std::string text, const std::string& what) {
  std::string original = text;
  for (auto& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (text == "auto") return plan::ExchangePolicy::Auto;
  if (text == "always") return plan::ExchangePolicy::Always;
  if (text == "never") return plan::ExchangePolicy::Never;
  bad(what, original, "auto, always or never");
}

}  // namespace

const std::vector<std::string>& known_backend_names() {
  static const std::vector<std::string> names = {"auto",  "pread",          "buffered", "direct",
                                                 "uring", "uring_buffered", "mmap"};
  return names;
}

uint64_t parse_byte_size(const std::string& text, const std::string& what) {
  const std::string accepted =
      "a positive integer number of bytes, optionally with a K, M or G suffix";
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) {
    bad(what, text, accepted);
  }
  char* end = nullptr;
  errno = 0;
  unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0) bad(what, text, accepted);
  std::string suffix(end);
  uint64_t scale = 1;
  if (suffix == "K" || suffix == "k")
    scale = 1ull << 10;
  else if (suffix == "M" || suffix == "m")
    scale = 1ull << 20;
  else if (suffix == "G" || suffix == "g")
    scale = 1ull << 30;
  else if (!suffix.empty())
    bad(what, text, accepted);
  if (value == 0 || value > (UINT64_MAX >> 2) / scale) bad(what, text, accepted);
  return value * scale;
}

double free_memory_share(std::optional<double> given) {
  if (given) {
    if (!(*given > 0.0 && *given <= 1.0)) {
      bad("max_free_mem_usage", std::to_string(*given), "a number in (0, 1]");
    }
    return *given;
  }
  auto text = env("INSTANTTENSOR_MAX_FREE_MEM_USAGE");
  if (!text) return plan::defaults::kFreeMemoryShare;
  char* end = nullptr;
  double value = std::strtod(text->c_str(), &end);
  if (text->empty() || *end != '\0' || !(value > 0.0 && value <= 1.0)) {
    bad("INSTANTTENSOR_MAX_FREE_MEM_USAGE", *text, "a number in (0, 1]");
  }
  return value;
}

ResolvedOptions resolve_options(const OpenOptions& options) {
  ResolvedOptions resolved;
  // A meta tensor holds no bytes to load into: refused here, in words, rather than failing deep in
  // the staging path. (The Python layer's device="meta" answers shapes without opening a target.)
  if (options.device.is_meta()) {
    bad("device", "meta",
        "a device with memory (the CPU or an accelerator); for shapes only, "
        "get_tensor_metadata");
  }
  // Accelerators: "cuda" means the current device, resolved now, so the loader's stream and
  // every tensor handed out carry a concrete index.
  resolved.device = options.device;
  if (!resolved.device.is_cpu() && !resolved.device.has_index()) {
    resolved.device = c10::impl::getDeviceGuardImpl(resolved.device.type())->getDevice();
  }
  resolved.copy = options.copy;
  resolved.keys = options.keys;
  resolved.buffer_size =
      positive(options.buffer_size, "buffer_size", "INSTANTTENSOR_BUFFER_SIZE", true);
  resolved.chunk_size =
      positive(options.chunk_size, "chunk_size", "INSTANTTENSOR_CHUNK_SIZE", true);
  resolved.concurrency = static_cast<int>(
      positive(options.concurrency, "concurrency", "INSTANTTENSOR_CONCURRENCY", false, 1024));
  resolved.io_depth =
      static_cast<int>(positive(options.io_depth, "io_depth", "INSTANTTENSOR_IO_DEPTH", false));
  if (options.backend) {
    resolved.backends = parse_backends(*options.backend, "backend");
  } else if (auto text = env("INSTANTTENSOR_BACKEND")) {
    resolved.backends = parse_backends(*text, "INSTANTTENSOR_BACKEND");
  } else {
    resolved.backends = {"auto"};
  }
  // Not environment variables. Checked here, before any cast to an unsigned size, so a
  // negative value is the same ValueError through every API.
  if (options.staging_size) {
    if (*options.staging_size <= 0) {
      bad("staging_size", std::to_string(*options.staging_size), "a positive number of bytes");
    }
    resolved.staging_size = static_cast<uint64_t>(*options.staging_size);
  }
  if (options.device_budget) {
    if (*options.device_budget < 0) {
      bad("device_budget", std::to_string(*options.device_budget), "0 or more bytes");
    }
    resolved.device_budget = static_cast<uint64_t>(*options.device_budget);
  }
  resolved.process_group = options.process_group;
  resolved.host_fallback = options.host_fallback;
  resolved.force_staging = options.force_staging;
  resolved.print_warnings = options.print_warnings;
  if (options.exchange) {
    resolved.exchange = parse_exchange(*options.exchange, "exchange");
  } else if (auto text = env("INSTANTTENSOR_EXCHANGE")) {
    resolved.exchange = parse_exchange(*text, "INSTANTTENSOR_EXCHANGE");
  }
  if (auto text = env("INSTANTTENSOR_DEBUG")) {
    if (*text == "1")
      resolved.debug = true;
    else if (*text != "0")
      bad("INSTANTTENSOR_DEBUG", *text, "0 or 1");
  }
  if (auto text = env("INSTANTTENSOR_TIMELINE")) {
    if (*text == "1")
      resolved.timeline = true;
    else if (*text != "0")
      bad("INSTANTTENSOR_TIMELINE", *text, "0 or 1");
  }
  // INSTANTTENSOR_MAX_FREE_MEM_USAGE only matters on accelerators, but a bad value is still an
  // error at open so a typo never goes unnoticed.
  resolved.free_share = free_memory_share(options.max_free_mem_usage);
  return resolved;
}

}  // namespace instanttensor::loader

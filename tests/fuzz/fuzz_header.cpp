// libFuzzer: arbitrary bytes as a whole safetensors file, through the header rules.
// Any outcome but acceptance or instanttensor::Error (a crash, another exception, a sanitizer
// report, a timeout) is a bug.
#include <cstddef>
#include <cstdint>

#include "format/header.h"
#include "instanttensor/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace instanttensor;
  try {
    uint64_t length =
        format::parse_length_prefix("fuzz.safetensors", data, size < 8 ? size : 8, size);
    auto header = format::parse_header_json("fuzz.safetensors",
                                            reinterpret_cast<const char*>(data) + 8, length, size);
    // Accepted: every entry must lie inside the file, as the loader will trust it.
    for (const auto& entry : header.tensors) {
      if (header.data_start() + entry.data_end > size) __builtin_trap();
    }
  } catch (const Error&) {
  }
  return 0;
}

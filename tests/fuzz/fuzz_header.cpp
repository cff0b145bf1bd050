// libFuzzer: arbitrary bytes as a whole safetensors file, through the header rules.
// Any outcome but acceptance or instanttensor::Error (a crash, another exception, a sanitizer
// report, a timeout) is a bug.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "format/header.h"
#include "instanttensor/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace instanttensor;
  try {
    uint64_t length =
        format::parse_length_prefix("fuzz.safetensors", data, size < 8 ? size : 8, size);
    auto header = format::parse_header_json("fuzz.safetensors",
                                            reinterpret_cast<const char*>(data) + 8, length, size);
    // Accepted: what the loader will trust must hold. Each entry lies inside the file (compared
    // without overflow), begin <= end, nbytes = elements x bits / 8, the entries cover the data
    // buffer exactly in storage order with no overlap, and names are unique.
    const uint64_t data_bytes = size - header.data_start();
    uint64_t expected_begin = 0;
    std::set<std::string> names;
    for (const auto& entry : header.tensors) {
      if (entry.data_begin > entry.data_end || entry.data_end > data_bytes) __builtin_trap();
      if (entry.data_begin != expected_begin) __builtin_trap();
      expected_begin = entry.data_end;
      unsigned __int128 bits = format::dtype_bits(entry.dtype);
      for (uint64_t dim : entry.shape) bits *= dim;
      if (bits % 8 != 0 || bits / 8 != entry.nbytes()) __builtin_trap();
      if (!names.insert(entry.name).second) __builtin_trap();
    }
    if (expected_begin != data_bytes) __builtin_trap();
  } catch (const Error&) {
  }
  return 0;
}

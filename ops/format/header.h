// Parsing and validating one safetensors header, to the rules of the reference reader, torch-free.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "format/dtype.h"

namespace instanttensor::format {

// The reference reader's cap on the JSON length (exactly this much is accepted).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// Not a rule of the reference reader (it has no cap): tensors plus metadata keys in one header.
// Bounds what parsing costs (each entry costs a few hundred bytes however short its text): the
// largest MoE checkpoints hold ~250k tensors in all, spread over many files.
constexpr size_t kMaxHeaderEntries = 1'000'000;

struct TensorEntry {
  std::string name;
  Dtype dtype;
  std::vector<uint64_t> shape;
  uint64_t data_begin = 0;  // relative to the start of the data buffer
  uint64_t data_end = 0;
  uint64_t nbytes() const { return data_end - data_begin; }
};

struct FileHeader {
  uint64_t header_length = 0;  // N, the JSON length; data starts at 8 + N
  uint64_t data_start() const { return 8 + header_length; }
  std::vector<TensorEntry> tensors;  // sorted by data offsets (storage order)
  bool has_metadata = false;
  std::map<std::string, std::string> metadata;
};

// Reads the 8-byte length prefix; checks rules 1-3 (too small, too large, past the end of the
// file) and returns N. `prefix` holds the first min(8, file_size) bytes. Throws Error(Format)
// naming `file_name`.
uint64_t parse_length_prefix(const std::string& file_name, const uint8_t* prefix,
                             uint64_t prefix_size, uint64_t file_size);

// Validates the JSON bytes (rules 4-7: UTF-8, JSON shape, dtypes, offsets, sizes, coverage of the
// file) and returns the entries in storage order. Also rejects duplicate tensor names, which the
// reference reader silently resolves last-wins. Throws Error(Format) naming the file, the tensor
// where there is one, and the rule broken. Pure function; any thread.
FileHeader parse_header_json(const std::string& file_name, const char* json, uint64_t length,
                             uint64_t file_size);

// Reads and validates the header of the open file `fd` (of `file_size` bytes) with pread; the
// fd's offset is untouched. Throws Error (Io, Format) naming `file_name`. Any thread.
FileHeader read_file_header(int fd, const std::string& file_name, uint64_t file_size);

}  // namespace instanttensor::format

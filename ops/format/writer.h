// Writing safetensors files that the reference reader accepts, torch-free.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "format/dtype.h"

namespace instanttensor::format {

struct WriterTensor {
  std::string name;
  Dtype dtype;
  std::vector<uint64_t> shape;  // in format elements (F4: two values per byte)
  const void* data = nullptr;   // nbytes little-endian bytes, borrowed for the call
  uint64_t nbytes = 0;
};

// The padded JSON header of a safetensors file holding `tensors` (the 8-byte length prefix is
// not included) and the order their data follows it in: descending dtype alignment, then name,
// so every tensor is naturally aligned; the JSON is padded with spaces to a multiple of 8 and lists
// __metadata__ first, then the tensors in data order, as the reference writer emits it. Rejects
// duplicate names, the name "__metadata__", and a byte count that does not match shape x dtype:
// Error naming `path` (a label where nothing is written) and the tensor. Pure; any thread.
struct SerializedHeader {
  std::string json;
  std::vector<size_t> order;  // indices into `tensors`, in data order
};
SerializedHeader serialize_header(const std::string& path, const std::vector<WriterTensor>& tensors,
                                  const std::map<std::string, std::string>* metadata);

// Writes `tensors` to `path` through a DurableFile: an unnamed file in the same folder (a named
// temporary where the file system has none), fsynced, renamed over `path`, the folder fsynced;
// a failed or killed write never leaves a half file under the name, nor a temporary behind. The
// layout and the refusals are serialize_header's. Throws Error naming the path and tensor. Any
// thread.
void write_safetensors(const std::string& path, const std::vector<WriterTensor>& tensors,
                       const std::map<std::string, std::string>* metadata);

}  // namespace instanttensor::format

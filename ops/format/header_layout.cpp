#include "format/header_layout.h"

#include <algorithm>
#include <tuple>
#include <vector>

#include "instanttensor/error.h"

namespace instanttensor::format {

void fail(const std::string& file, const std::string& tensor, const std::string& rule,
          const std::string& detail) {
  throw Error(ErrorKind::Format, file, tensor, rule + ": " + detail);
}

void check_layout(const std::string& file_name, FileHeader& header, uint64_t file_size) {
  const uint64_t length = header.header_length;
  // Duplicate names: the reference keeps the last definition silently; a second definition is
  // how a file can smuggle different bytes past another reader, so it is an error here.
  std::vector<const TensorEntry*> by_name;
  by_name.reserve(header.tensors.size());
  for (const auto& entry : header.tensors) by_name.push_back(&entry);
  std::sort(by_name.begin(), by_name.end(),
            [](const TensorEntry* a, const TensorEntry* b) { return a->name < b->name; });
  for (size_t i = 1; i < by_name.size(); ++i) {
    if (by_name[i]->name == by_name[i - 1]->name) {
      fail(file_name, by_name[i]->name, "DuplicateTensorName",
           "the name is defined twice in the header");
    }
  }

  // Storage order; empty tensors sharing an offset in name order, whatever the document order.
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const TensorEntry& a, const TensorEntry& b) {
              return std::tie(a.data_begin, a.data_end, a.name) <
                     std::tie(b.data_begin, b.data_end, b.name);
            });
  uint64_t start = 0;
  for (const auto& entry : header.tensors) {
    if (entry.data_begin != start || entry.data_end < entry.data_begin) {
      fail(file_name, entry.name, "InvalidOffset",
           "data_offsets [" + std::to_string(entry.data_begin) + ", " +
               std::to_string(entry.data_end) + "] do not continue at " + std::to_string(start) +
               " (gap, overlap or reversed range)");
    }
    start = entry.data_end;
    uint64_t elements = 1;
    for (uint64_t dim : entry.shape) {
      if (dim != 0 && elements > UINT64_MAX / dim) {
        fail(file_name, entry.name, "ValidationOverflow", "shape element count overflows");
      }
      elements *= dim;
    }
    uint64_t bits_per = dtype_bits(entry.dtype);
    if (elements > UINT64_MAX / bits_per) {
      fail(file_name, entry.name, "ValidationOverflow", "shape bit count overflows");
    }
    uint64_t bits = elements * bits_per;
    if (bits % 8 != 0) {
      fail(file_name, entry.name, "MisalignedSlice",
           std::to_string(elements) + " elements of " + dtype_name(entry.dtype) +
               " do not fill whole bytes");
    }
    if (entry.nbytes() != bits / 8) {
      fail(file_name, entry.name, "TensorInvalidInfo",
           "data_offsets span " + std::to_string(entry.nbytes()) + " bytes but shape x dtype is " +
               std::to_string(bits / 8) + " bytes");
    }
  }
  if (start + 8 + length != file_size) {
    fail(file_name, "", "MetadataIncompleteBuffer",
         "tensors cover " + std::to_string(start) + " data bytes, but the file holds " +
             std::to_string(file_size - 8 - length) + " (truncated file or trailing bytes)");
  }
}

}  // namespace instanttensor::format

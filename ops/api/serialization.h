// safetensors' byte-level API (serialize, deserialize) as operator bodies: the header rules stay in
// format/ (one writer, one parser); the Python layer joins the bytes.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace instanttensor {

// The padded JSON header of a file holding the described tensors, and the order their bytes follow
// it in (format::serialize_header). Tensor i has format dtype `dtypes[i]` ("F32", ...), shape
// `dims[sum(ranks[:i]) : sum(ranks[:i+1])]` in format elements and `nbytes[i]` bytes. Metadata as
// two parallel lists, absent when has_metadata is false. Throws Error(Argument) naming `label` and
// the tensor for an unknown dtype, unequal lengths or a byte count that does not match. Reads no
// tensor memory; any thread.
std::tuple<std::string, std::vector<int64_t>> serialize_header_op(
    std::vector<std::string> names, std::vector<std::string> dtypes, std::vector<int64_t> ranks,
    std::vector<int64_t> dims, std::vector<int64_t> nbytes, std::vector<std::string> metadata_keys,
    std::vector<std::string> metadata_values, bool has_metadata, std::string label);

// Writes the described tensors to `file` durably (format::write_safetensors): tensor i's bytes are
// `data[i]` (CPU uint8, contiguous, borrowed for the call), its dtype and shape as in
// serialize_header. The caller keeps the memory alive and unchanged during the call; the GIL is
// not held (torch.ops releases it), so calls from several threads write in parallel. Throws Error
// naming `file` and the tensor; the old file is intact on failure.
void serialize_file_op(const std::vector<at::Tensor>& data, std::vector<std::string> names,
                       std::vector<std::string> dtypes, std::vector<int64_t> ranks,
                       std::vector<int64_t> dims, std::string file,
                       std::vector<std::string> metadata_keys,
                       std::vector<std::string> metadata_values, bool has_metadata);

// Parses the header at the start of an in-memory safetensors buffer of `total_size` bytes, to the
// reader's rules. `head` (uint8, CPU, contiguous) holds at least the first min(total_size,
// 8 + N) bytes. Returns (names, format dtypes, ranks, flat dims, begins, ends) in storage order
// with offsets relative to the data start, then (has_metadata, metadata keys, values) and the data
// start. Throws Error(Format) naming `label` for a header that breaks a rule, Error(Argument) for
// a `head` that is not CPU bytes or too short to hold the header. Any thread.
std::tuple<std::vector<std::string>, std::vector<std::string>, std::vector<int64_t>,
           std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, bool,
           std::vector<std::string>, std::vector<std::string>, int64_t>
parse_header_bytes_op(const at::Tensor& head, int64_t total_size, std::string label);

}  // namespace instanttensor

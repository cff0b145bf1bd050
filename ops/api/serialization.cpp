#include "api/serialization.h"

#include <map>
#include <optional>

#include "format/header.h"
#include "format/writer.h"
#include "instanttensor/error.h"

namespace instanttensor {

namespace {

// The writer's entries for tensors described by parallel lists (data pointers left null).
std::vector<format::WriterTensor> describe(const std::vector<std::string>& names,
                                           const std::vector<std::string>& dtypes,
                                           const std::vector<int64_t>& ranks,
                                           const std::vector<int64_t>& dims,
                                           const std::vector<int64_t>& nbytes,
                                           const std::string& label) {
  if (dtypes.size() != names.size() || ranks.size() != names.size() ||
      nbytes.size() != names.size()) {
    throw Error(ErrorKind::Argument, label, "", "serialize: argument lists differ in length");
  }
  std::vector<format::WriterTensor> tensors(names.size());
  size_t next_dim = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    format::WriterTensor& t = tensors[i];
    t.name = names[i];
    auto dtype = format::dtype_from_name(dtypes[i]);
    if (!dtype) throw Error(ErrorKind::Argument, label, names[i], "unknown dtype " + dtypes[i]);
    t.dtype = *dtype;
    if (ranks[i] < 0 || next_dim + static_cast<size_t>(ranks[i]) > dims.size()) {
      throw Error(ErrorKind::Argument, label, names[i], "serialize: shape list too short");
    }
    for (int64_t r = 0; r < ranks[i]; ++r) {
      int64_t dim = dims[next_dim++];
      if (dim < 0) throw Error(ErrorKind::Argument, label, names[i], "negative dimension");
      t.shape.push_back(static_cast<uint64_t>(dim));
    }
    if (nbytes[i] < 0) throw Error(ErrorKind::Argument, label, names[i], "negative byte count");
    t.nbytes = static_cast<uint64_t>(nbytes[i]);
  }
  if (next_dim != dims.size()) {
    throw Error(ErrorKind::Argument, label, "", "serialize: more dimensions than the ranks hold");
  }
  return tensors;
}

std::optional<std::map<std::string, std::string>> metadata_of(
    const std::vector<std::string>& keys, const std::vector<std::string>& values, bool present,
    const std::string& label) {
  if (keys.size() != values.size()) {
    throw Error(ErrorKind::Argument, label, "", "metadata keys and values differ in length");
  }
  if (!present) return std::nullopt;
  std::map<std::string, std::string> metadata;
  for (size_t i = 0; i < keys.size(); ++i) metadata[keys[i]] = values[i];
  return metadata;
}

}  // namespace

std::tuple<std::string, std::vector<int64_t>> serialize_header_op(
    std::vector<std::string> names, std::vector<std::string> dtypes, std::vector<int64_t> ranks,
    std::vector<int64_t> dims, std::vector<int64_t> nbytes, std::vector<std::string> metadata_keys,
    std::vector<std::string> metadata_values, bool has_metadata, std::string label) {
  auto tensors = describe(names, dtypes, ranks, dims, nbytes, label);
  auto metadata = metadata_of(metadata_keys, metadata_values, has_metadata, label);
  format::SerializedHeader header =
      format::serialize_header(label, tensors, metadata ? &*metadata : nullptr);
  return {std::move(header.json), std::vector<int64_t>(header.order.begin(), header.order.end())};
}

void serialize_file_op(const std::vector<at::Tensor>& data, std::vector<std::string> names,
                       std::vector<std::string> dtypes, std::vector<int64_t> ranks,
                       std::vector<int64_t> dims, std::string file,
                       std::vector<std::string> metadata_keys,
                       std::vector<std::string> metadata_values, bool has_metadata) {
  if (data.size() != names.size()) {
    throw Error(ErrorKind::Argument, file, "", "serialize_file: data and names differ in length");
  }
  std::vector<int64_t> nbytes;
  for (size_t i = 0; i < data.size(); ++i) {
    const at::Tensor& bytes = data[i];
    if (!bytes.defined() || bytes.device().type() != c10::kCPU ||
        bytes.scalar_type() != at::kByte || !bytes.is_contiguous()) {
      throw Error(ErrorKind::Argument, file, names[i], "serialize_file: data must be CPU bytes");
    }
    nbytes.push_back(bytes.numel());
  }
  auto tensors = describe(names, dtypes, ranks, dims, nbytes, file);
  for (size_t i = 0; i < data.size(); ++i) {
    tensors[i].data = data[i].numel() > 0 ? data[i].data_ptr() : nullptr;
  }
  auto metadata = metadata_of(metadata_keys, metadata_values, has_metadata, file);
  format::write_safetensors(file, tensors, metadata ? &*metadata : nullptr);
}

std::tuple<std::vector<std::string>, std::vector<std::string>, std::vector<int64_t>,
           std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, bool,
           std::vector<std::string>, std::vector<std::string>, int64_t>
parse_header_bytes_op(const at::Tensor& head, int64_t total_size, std::string label) {
  if (head.device().type() != c10::kCPU || head.scalar_type() != at::kByte ||
      !head.is_contiguous() || total_size < 0 || head.numel() > total_size) {
    throw Error(ErrorKind::Argument, label, "", "deserialize: the head must be CPU uint8 bytes");
  }
  const auto* bytes = head.numel() > 0 ? head.data_ptr<uint8_t>() : nullptr;
  const auto available = static_cast<uint64_t>(head.numel());
  const auto size = static_cast<uint64_t>(total_size);
  uint64_t length =
      format::parse_length_prefix(label, bytes, std::min<uint64_t>(available, 8), size);
  if (available < 8 + length) {
    throw Error(ErrorKind::Argument, label, "", "deserialize: the head does not hold the header");
  }
  format::FileHeader header =
      format::parse_header_json(label, reinterpret_cast<const char*>(bytes) + 8, length, size);
  std::vector<std::string> names, dtypes, keys, values;
  std::vector<int64_t> ranks, dims, begins, ends;
  for (const auto& t : header.tensors) {
    names.push_back(t.name);
    dtypes.push_back(format::dtype_name(t.dtype));
    ranks.push_back(static_cast<int64_t>(t.shape.size()));
    for (uint64_t dim : t.shape) dims.push_back(static_cast<int64_t>(dim));
    begins.push_back(static_cast<int64_t>(t.data_begin));
    ends.push_back(static_cast<int64_t>(t.data_end));
  }
  for (const auto& [key, value] : header.metadata) {
    keys.push_back(key);
    values.push_back(value);
  }
  return {std::move(names),    std::move(dtypes),
          std::move(ranks),    std::move(dims),
          std::move(begins),   std::move(ends),
          header.has_metadata, std::move(keys),
          std::move(values),   static_cast<int64_t>(header.data_start())};
}

}  // namespace instanttensor

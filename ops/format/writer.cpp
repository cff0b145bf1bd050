#include "format/writer.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "format/durable_file.h"
#include "instanttensor/error.h"

namespace instanttensor::format {

namespace {

uint64_t expected_bytes(const WriterTensor& t, const std::string& path) {
  uint64_t elements = 1;
  for (uint64_t dim : t.shape) {
    if (dim != 0 && elements > UINT64_MAX / dim) {
      throw Error(ErrorKind::Argument, path, t.name, "shape element count overflows");
    }
    elements *= dim;
  }
  uint64_t bits = elements * dtype_bits(t.dtype);
  if (bits % 8 != 0) {
    throw Error(ErrorKind::Argument, path, t.name, "elements do not fill whole bytes");
  }
  return bits / 8;
}

}  // namespace

SerializedHeader serialize_header(const std::string& path, const std::vector<WriterTensor>& tensors,
                                  const std::map<std::string, std::string>* metadata) {
  std::vector<size_t> order;
  std::set<std::string> names;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const WriterTensor& t = tensors[i];
    if (t.name == "__metadata__") {
      throw Error(ErrorKind::Argument, path, t.name, "the name is reserved for file metadata");
    }
    if (!names.insert(t.name).second) {
      throw Error(ErrorKind::Argument, path, t.name, "tensor name given twice");
    }
    if (expected_bytes(t, path) != t.nbytes) {
      throw Error(ErrorKind::Argument, path, t.name,
                  "byte count " + std::to_string(t.nbytes) + " does not match shape x dtype");
    }
    order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&tensors](size_t i, size_t j) {
    const WriterTensor& a = tensors[i];
    const WriterTensor& b = tensors[j];
    int ra = dtype_writer_rank(a.dtype), rb = dtype_writer_rank(b.dtype);
    if (ra != rb) return ra > rb;
    return a.name < b.name;
  });

  // Insertion-ordered, as the reference writer emits it: metadata first, then data order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (metadata != nullptr) {
    header["__metadata__"] = nlohmann::ordered_json::object();
    for (const auto& [key, value] : *metadata) header["__metadata__"][key] = value;
  }
  uint64_t offset = 0;
  for (size_t i : order) {
    const WriterTensor& t = tensors[i];
    nlohmann::ordered_json info = nlohmann::ordered_json::object();
    info["dtype"] = dtype_name(t.dtype);
    info["shape"] = t.shape;
    info["data_offsets"] = {offset, offset + t.nbytes};
    header[t.name] = std::move(info);
    offset += t.nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::Argument, path, "", std::string("header not encodable: ") + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  return {std::move(text), std::move(order)};
}

void write_safetensors(const std::string& path, const std::vector<WriterTensor>& tensors,
                       const std::map<std::string, std::string>* metadata) {
  SerializedHeader header = serialize_header(path, tensors, metadata);
  const std::string& text = header.json;
  uint8_t prefix[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<uint8_t>(n >> (8 * i));

  DurableFile file(path);
  file.write(prefix, 8);
  file.write(text.data(), text.size());
  for (size_t i : header.order) file.write(tensors[i].data, tensors[i].nbytes);
  file.commit();
}

}  // namespace instanttensor::format

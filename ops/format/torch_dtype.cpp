#include "format/torch_dtype.h"

#include "instanttensor/error.h"

namespace instanttensor::format {

namespace {
using format::Dtype;
// The one table of element types: the format's, torch's, and torch's attribute name (which the
// Python package asks for through torch.ops.instanttensor.dtype_table).
struct Pair {
  Dtype format;
  c10::ScalarType torch;
  const char* torch_name;
};
constexpr Pair kPairs[] = {
    {Dtype::BOOL, c10::ScalarType::Bool, "bool"},
    {Dtype::U8, c10::ScalarType::Byte, "uint8"},
    {Dtype::I8, c10::ScalarType::Char, "int8"},
    {Dtype::F8_E5M2, c10::ScalarType::Float8_e5m2, "float8_e5m2"},
    {Dtype::F8_E4M3, c10::ScalarType::Float8_e4m3fn, "float8_e4m3fn"},
    {Dtype::F8_E8M0, c10::ScalarType::Float8_e8m0fnu, "float8_e8m0fnu"},
    {Dtype::F8_E4M3FNUZ, c10::ScalarType::Float8_e4m3fnuz, "float8_e4m3fnuz"},
    {Dtype::F8_E5M2FNUZ, c10::ScalarType::Float8_e5m2fnuz, "float8_e5m2fnuz"},
    {Dtype::I16, c10::ScalarType::Short, "int16"},
    {Dtype::U16, c10::ScalarType::UInt16, "uint16"},
    {Dtype::F16, c10::ScalarType::Half, "float16"},
    {Dtype::BF16, c10::ScalarType::BFloat16, "bfloat16"},
    {Dtype::I32, c10::ScalarType::Int, "int32"},
    {Dtype::U32, c10::ScalarType::UInt32, "uint32"},
    {Dtype::F32, c10::ScalarType::Float, "float32"},
    {Dtype::C64, c10::ScalarType::ComplexFloat, "complex64"},
    {Dtype::F64, c10::ScalarType::Double, "float64"},
    {Dtype::I64, c10::ScalarType::Long, "int64"},
    {Dtype::U64, c10::ScalarType::UInt64, "uint64"},
    {Dtype::F4, c10::ScalarType::Float4_e2m1fn_x2, "float4_e2m1fn_x2"},
};
}  // namespace

c10::ScalarType to_torch_dtype(Dtype dtype, const std::string& file, const std::string& tensor) {
  for (const auto& pair : kPairs) {
    if (pair.format == dtype) return pair.torch;
  }
  throw Error(ErrorKind::Format, file, tensor,
              std::string("dtype ") + format::dtype_name(dtype) + " has no torch equivalent");
}

Dtype from_torch_dtype(c10::ScalarType dtype, const std::string& file, const std::string& tensor) {
  for (const auto& pair : kPairs) {
    if (pair.torch == dtype) return pair.format;
  }
  throw Error(
      ErrorKind::Argument, file, tensor,
      std::string("torch dtype ") + c10::toString(dtype) + " cannot be stored in safetensors");
}

std::string torch_dtype_name(c10::ScalarType dtype) {
  for (const auto& pair : kPairs) {
    if (pair.torch == dtype) return pair.torch_name;
  }
  return c10::toString(dtype);
}

std::vector<std::pair<std::string, std::string>> dtype_table() {
  std::vector<std::pair<std::string, std::string>> table;
  for (const auto& pair : kPairs)
    table.emplace_back(pair.torch_name, format::dtype_name(pair.format));
  return table;
}

std::vector<int64_t> to_torch_shape(const format::TensorEntry& entry, const std::string& file) {
  std::vector<int64_t> shape(entry.shape.begin(), entry.shape.end());
  for (uint64_t dim : entry.shape) {
    if (dim > static_cast<uint64_t>(INT64_MAX)) {
      throw Error(ErrorKind::Format, file, entry.name, "dimension too large for torch");
    }
  }
  if (entry.dtype == Dtype::F4) {
    if (shape.empty() || shape.back() % 2 != 0) {
      throw Error(ErrorKind::Format, file, entry.name,
                  "F4 tensor needs an even last dimension to map to float4_e2m1fn_x2");
    }
    shape.back() /= 2;
  }
  return shape;
}

}  // namespace instanttensor::format

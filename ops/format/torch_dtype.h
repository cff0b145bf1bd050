// The torch glue of the format layer: dtypes and shapes as torch sees them.
#pragma once

#include <c10/core/ScalarType.h>

#include <string>
#include <utility>
#include <vector>

#include "format/dtype.h"
#include "format/header.h"

namespace instanttensor::format {

// The torch dtype of a format dtype. F6_* (and anything torch lacks) is Error(Format) naming
// `file` and `tensor` and the dtype, never a guess.
c10::ScalarType to_torch_dtype(format::Dtype dtype, const std::string& file,
                               const std::string& tensor);

// The format dtype for a torch dtype; Error(Argument) naming the tensor for dtypes the format
// has no name for.
format::Dtype from_torch_dtype(c10::ScalarType dtype, const std::string& file,
                               const std::string& tensor);

// torch's attribute name of a dtype ("bfloat16", "float8_e4m3fn"); c10's name for dtypes the
// format has no name for.
std::string torch_dtype_name(c10::ScalarType dtype);

// Every (torch attribute name, format name) pair, in the table's order: the one table the Python
// package and the registrations read. Any thread.
std::vector<std::pair<std::string, std::string>> dtype_table();

// The torch shape of an entry: the format shape, with the last dimension halved for F4 (two
// values per float4_e2m1fn_x2 byte). An F4 entry whose last dimension is odd (or a 0-d F4) has
// no torch layout: Error(Format).
std::vector<int64_t> to_torch_shape(const format::TensorEntry& entry, const std::string& file);

}  // namespace instanttensor::format

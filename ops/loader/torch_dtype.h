// The torch glue of the format layer: dtypes and shapes as torch sees them.
#pragma once

#include <c10/core/ScalarType.h>

#include <string>
#include <vector>

#include "format/dtype.h"
#include "format/header.h"

namespace instanttensor::loader {

// The torch dtype of a format dtype. F6_* (and anything torch lacks) is Error(Format) naming
// `file` and `tensor` and the dtype, never a guess.
c10::ScalarType to_torch_dtype(format::Dtype dtype, const std::string& file,
                               const std::string& tensor);

// The format dtype for a torch dtype; Error(Argument) naming the tensor for dtypes the format
// has no name for.
format::Dtype from_torch_dtype(c10::ScalarType dtype, const std::string& file,
                               const std::string& tensor);

// The torch shape of an entry: the format shape, with the last dimension halved for F4 (two
// values per float4_e2m1fn_x2 byte). An F4 entry whose last dimension is odd (or a 0-d F4) has
// no torch layout: Error(Format).
std::vector<int64_t> to_torch_shape(const format::TensorEntry& entry, const std::string& file);

}  // namespace instanttensor::loader

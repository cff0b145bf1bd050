// load_file's one implementation, for the C++ face (instanttensor::load_file) and the operator
// the Python face calls (torch.ops.instanttensor.load_file).
#pragma once

#include <ATen/Tensor.h>

#include <string>
#include <tuple>
#include <vector>

namespace instanttensor {

// Every tensor of `file` as an owned tensor on `device`: (names, tensors), tensors[i] named
// names[i], in storage order (the operator's own return). A small file on the host is read
// tensor by tensor into memory of its own, a larger one (or any to a device) takes one pass of
// the loader (plan::choose_load_file_path). Throws Error naming the file and the tensor. Any
// thread; the tensors are the caller's.
std::tuple<std::vector<std::string>, std::vector<at::Tensor>> load_file_in_storage_order(
    const std::string& file, c10::Device device);

}  // namespace instanttensor

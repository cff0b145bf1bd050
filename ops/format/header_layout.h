// The rules a parsed header's tensor entries must meet together: unique names, data offsets
// that tile the data buffer in storage order, sizes that match shape x dtype, and a buffer that
// ends where the file does.
#pragma once

#include <cstdint>
#include <string>

#include "format/header.h"

namespace instanttensor::format {

// Error(Format) naming the broken rule, the file and the tensor (empty: none): the one way the
// header's parts report a broken rule. Any thread.
[[noreturn]] void fail(const std::string& file, const std::string& tensor, const std::string& rule,
                       const std::string& detail);

// Sorts header.tensors into storage order (empty tensors sharing an offset by name) and checks
// them against a file of `file_size` bytes; any rule broken is Error(Format) naming the rule,
// `file_name` and the tensor. Pure; any thread.
void check_layout(const std::string& file_name, FileHeader& header, uint64_t file_size);

}  // namespace instanttensor::format

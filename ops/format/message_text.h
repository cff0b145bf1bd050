// Pieces of error messages that several checks write the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace instanttensor::format {

// "[4, 3]". Any thread.
std::string shape_text(const std::vector<int64_t>& shape);

// The first `shown` names, comma-separated, then ", and N more": a checkpoint of another model
// lists thousands. Any thread.
std::string some_names(const std::vector<std::string>& names, size_t shown = 20);

}  // namespace instanttensor::format

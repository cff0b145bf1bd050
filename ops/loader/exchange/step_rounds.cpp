#include "loader/exchange/step_rounds.h"

namespace instanttensor::loader {

StepRounds::StepRounds(const std::vector<uint64_t>& item_bytes, uint64_t stride) {
  uint64_t before = 0;  // bytes of the items before the current one
  uint64_t next_mark = stride;
  for (size_t i = 0; i < item_bytes.size(); ++i) {
    if (i > 0 && before >= next_mark) {
      at_items_.push_back(i);
      next_mark = (before / stride + 1) * stride;
    }
    before += item_bytes[i];
  }
  at_items_.push_back(item_bytes.size());
}

}  // namespace instanttensor::loader

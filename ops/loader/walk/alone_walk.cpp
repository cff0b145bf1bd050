#include "loader/walk/alone_walk.h"

namespace instanttensor::loader {

std::optional<std::pair<std::string, at::Tensor>> AloneWalk::next() {
  const PassState& state = pass_.state();
  if (!state.started) pass_.begin();
  if (state.error) throw *state.error;
  if (state.next_item >= pass_.plan().reads.items.size()) {
    pass_.end();
    return std::nullopt;
  }
  size_t item = state.next_item;
  pass_.prepare(item);
  return pass_.hand_out(item);
}

}  // namespace instanttensor::loader

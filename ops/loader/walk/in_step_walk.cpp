#include "loader/walk/in_step_walk.h"

namespace instanttensor::loader {

std::optional<std::pair<std::string, at::Tensor>> InStepWalk::next() {
  const PassState& state = pass_.state();
  const PassPlan& plan = pass_.plan();
  if (state.error) throw *state.error;
  std::optional<Error> failure;
  try {
    if (!state.started) {
      rounds_done_ = 0;
      pass_.begin();
    }
  } catch (const Error& e) {
    failure = e;
  }
  if (!failure && rounds_done_ >= rounds_.count()) return std::nullopt;
  const size_t item = state.next_item;
  const size_t items = plan.reads.items.size();
  if (!failure) failure = pass_.settle(item);
  if (failure || rounds_.item_of(rounds_done_) == item) {
    status_round(failure,
                 item < items ? plan.file_of(plan.tensor_of_item(item)) : plan.first_path());
    rounds_done_ += 1;
  }
  if (item >= items) {
    pass_.end();
    return std::nullopt;
  }
  return pass_.hand_out(item);
}

}  // namespace instanttensor::loader

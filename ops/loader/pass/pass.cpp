#include "loader/pass/pass.h"

#include <c10/util/Exception.h>

namespace instanttensor::loader {

void Pass::begin() {
  drain();
  state_.begin(plan_.reads);
  on_begin();
  try {
    plan_.checkpoint->check_unchanged();
  } catch (const Error& e) {
    state_.error.emplace(e);  // the pass is over before it began; the next step keeps saying why
    throw;
  }
}

void Pass::fail(Error error) {
  drain();
  state_.error.emplace(std::move(error));
  throw *state_.error;
}

void Pass::unbegin() noexcept {
  drain();
  state_.started = false;
  state_.error.reset();
}

void Pass::refuse_after_fork(Error refusal) {
  if (state_.started && !state_.error) state_.error.emplace(std::move(refusal));
}

void Pass::forget_items() noexcept {
  state_.items.clear();
  state_.groups.clear();
}

Error Pass::failure_of(const std::exception& e, size_t item) const {
  const auto& t = plan_.tensor_of_item(item);
  // A device out-of-memory error keeps its kind, so every rank raises torch's
  // OutOfMemoryError (a caller may retry with a smaller buffer), not an I/O error.
  const bool out_of_memory = dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr;
  return Error(out_of_memory ? ErrorKind::OutOfMemory : ErrorKind::Io, plan_.file_of(t), t.name(),
               out_of_memory ? c10::str("out of device memory: ", e.what()) : e.what());
}

}  // namespace instanttensor::loader

#include "loader/pass/mapped_pass.h"

namespace instanttensor::loader {

std::pair<std::string, at::Tensor> MappedPass::hand_out(size_t item) {
  state_.next_item = item + 1;
  const auto& t = plan_.tensor_of_item(item);
  auto spec = factory_.spec(t);
  stats_.tensors_loaded += 1;
  auto storage = factory_.mapped(io_.mapping(), t, 0, t.nbytes);
  return {t.name(), factory_.aligned(TensorFactory::over(std::move(storage), spec), t)};
}

}  // namespace instanttensor::loader

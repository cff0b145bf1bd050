// One process walking its pass alone (or a rank that reads everything with no group to meet).
#pragma once

#include "loader/walk/walk.h"

namespace instanttensor::loader {

class AloneWalk : public Walk {
 public:
  using Walk::Walk;
  std::optional<std::pair<std::string, at::Tensor>> next() override;
};

}  // namespace instanttensor::loader

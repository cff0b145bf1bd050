#include "loader/walk/ranks_walk.h"

#include <c10/util/StringUtil.h>

namespace instanttensor::loader {

void RanksWalk::restart() { pass_.unbegin(); }

std::string RanksWalk::rank_label() const {
  if (!exchange_) return "";  // left behind in a forked child
  return c10::str(" (rank ", exchange_->rank(), " of ", exchange_->world(), ")");
}

void RanksWalk::status_round(const std::optional<Error>& failure, const std::string& file) {
  try {
    exchange_->status_round(failure, file, stats_);
  } catch (const Error& e) {
    pass_.fail(e);
  }
}

}  // namespace instanttensor::loader

#include "loader/pass/leased_views.h"

#include <iterator>

namespace instanttensor::loader {

void LeasedViews::add(size_t file, uint64_t offset, uint64_t nbytes,
                      const std::shared_ptr<io::ViewProtection>& protection) {
  by_file_[file].insert_or_assign(
      offset, Entry{offset + nbytes, protection->begin(), protection->end(), protection});
}

bool LeasedViews::shows_bytes(size_t file, uint64_t offset, uint64_t nbytes) {
  bool shown = false;
  each_meeting(by_file_[file], offset, offset + nbytes, bytes,
               [&](uint64_t, uint64_t) { shown = true; });
  return shown;
}

bool LeasedViews::forget_ended() {
  bool any = false;
  for (auto& index : by_file_) {
    for (auto it = index.begin(); it != index.end();) {
      it = it->second.protection.expired() ? index.erase(it) : std::next(it);
    }
    any = any || !index.empty();
  }
  return any;
}

}  // namespace instanttensor::loader

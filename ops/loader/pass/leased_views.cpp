#include "loader/pass/leased_views.h"

#include <iterator>
#include <utility>

namespace instanttensor::loader {

void LeasedViews::add(size_t file, uint64_t offset, uint64_t nbytes, uint64_t pages_begin,
                      uint64_t pages_end, std::weak_ptr<const void> alive) {
  by_file_[file].insert_or_assign(offset,
                                  Entry{offset + nbytes, pages_begin, pages_end, std::move(alive)});
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
      it = it->second.alive.expired() ? index.erase(it) : std::next(it);
    }
    any = any || !index.empty();
  }
  return any;
}

}  // namespace instanttensor::loader

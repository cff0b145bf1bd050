#include "loader/pass/leased_views.h"

#include <iterator>

namespace instanttensor::loader {

void LeasedViews::add(size_t file, uint64_t offset, uint64_t nbytes,
                      const std::shared_ptr<io::ViewProtection>& protection) {
  by_file_[file].insert_or_assign(
      offset, Entry{offset + nbytes, protection->begin(), protection->end(), protection});
}

template <typename Range, typename Met>
void LeasedViews::each_meeting(Index& index, uint64_t begin, uint64_t end, Range range, Met met) {
  // An entry whose first byte is at or past `begin` ends past it; an earlier one reaches into
  // [begin, end) (a shared page) only through its end, and ends are ordered: step back while
  // they do.
  auto it = index.lower_bound(begin);
  while (it != index.begin() && range(*std::prev(it)).second > begin) --it;
  while (it != index.end()) {
    const auto [first, last] = range(*it);
    if (first >= end) break;
    if (it->second.protection.expired()) {
      it = index.erase(it);
      continue;
    }
    if (last > begin) met(first, last);
    ++it;
  }
}

bool LeasedViews::shows_bytes(size_t file, uint64_t offset, uint64_t nbytes) {
  bool shown = false;
  auto bytes = [](const Index::value_type& e) {
    return std::make_pair(e.first, e.second.bytes_end);
  };
  each_meeting(by_file_[file], offset, offset + nbytes, bytes,
               [&](uint64_t, uint64_t) { shown = true; });
  return shown;
}

std::vector<std::pair<uint64_t, uint64_t>> LeasedViews::pages_kept(size_t file, uint64_t begin,
                                                                   uint64_t end) {
  std::vector<std::pair<uint64_t, uint64_t>> kept;
  auto pages = [](const Index::value_type& e) {
    return std::make_pair(e.second.pages_begin, e.second.pages_end);
  };
  each_meeting(by_file_[file], begin, end, pages,
               [&](uint64_t first, uint64_t last) { kept.emplace_back(first, last); });
  return kept;
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

// load_into's checks, before a byte is written: names matched to the selected tensors, each
// destination's dtype, shape and layout, and no two destinations sharing memory.
#include <ATen/MemoryOverlap.h>

#include <algorithm>
#include <tuple>
#include <unordered_map>

#include "format/message_text.h"
#include "format/torch_dtype.h"
#include "loader/access/load_into.h"

namespace instanttensor::loader {

namespace {

// [first byte, one past the last byte) that a strided destination's elements touch.
std::pair<uintptr_t, uintptr_t> byte_extent(const at::Tensor& t) {
  auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  uint64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    last += static_cast<uint64_t>(t.size(d) - 1) * static_cast<uint64_t>(t.stride(d));
  }
  return {begin, begin + (last + 1) * t.element_size()};
}

void check_destination(const format::Checkpoint& checkpoint, const Fill& fill) {
  const auto& t = *fill.source;
  const std::string& file = checkpoint.path_of(t);
  const at::Tensor& dest = fill.destination;
  auto fail = [&](const std::string& why) {
    throw Error(ErrorKind::Argument, file, t.name(), "load_into: the destination " + why);
  };
  if (!dest.defined()) fail("is an undefined tensor");
  if (dest.layout() != at::kStrided) fail("is not a strided tensor");
  if (dest.is_meta()) fail("is a meta tensor, with no memory to fill");
  auto dtype = format::to_torch_dtype(t.entry->dtype, file, t.name());
  if (dest.scalar_type() != dtype) {
    fail(std::string("has dtype ") + c10::toString(dest.scalar_type()) + ", the file has " +
         c10::toString(dtype));
  }
  auto shape = format::to_torch_shape(*t.entry, file);
  if (dest.sizes() != c10::IntArrayRef(shape)) {
    fail("has shape " + format::shape_text(dest.sizes().vec()) + ", the file has " +
         format::shape_text(shape));
  }
  if (dest.numel() > 0 && at::has_internal_overlap(dest) == at::MemOverlap::Yes) {
    fail("is not writable element by element (its elements overlap, as in an expanded tensor)");
  }
}

}  // namespace

MatchedDestinations match_destinations(const format::Checkpoint& checkpoint,
                                       const std::vector<size_t>& selected,
                                       const std::vector<std::string>& names,
                                       const std::vector<at::Tensor>& tensors, bool strict) {
  const std::string& first_file = checkpoint.files()[0].path;
  if (names.size() != tensors.size()) {
    throw Error(ErrorKind::Argument, first_file, "",
                "load_into: " + std::to_string(tensors.size()) + " destinations for " +
                    std::to_string(names.size()) + " names");
  }
  std::unordered_map<std::string, size_t> by_name;
  for (size_t i = 0; i < names.size(); ++i) {
    if (!by_name.emplace(names[i], i).second) {
      throw Error(ErrorKind::Argument, first_file, names[i], "load_into: the name is given twice");
    }
  }
  MatchedDestinations matched;
  std::vector<bool> used(names.size(), false);
  for (size_t index : selected) {
    const auto& t = checkpoint.tensors()[index];
    auto found = by_name.find(t.name());
    if (found == by_name.end()) {
      matched.result.unexpected_keys.push_back(t.name());
      continue;
    }
    used[found->second] = true;
    matched.fills.push_back(Fill{&t, tensors[found->second]});
  }
  for (size_t i = 0; i < names.size(); ++i) {
    if (!used[i]) matched.result.missing_keys.push_back(names[i]);
  }
  std::sort(matched.result.missing_keys.begin(), matched.result.missing_keys.end());
  std::sort(matched.result.unexpected_keys.begin(), matched.result.unexpected_keys.end());
  if (strict && (!matched.result.missing_keys.empty() || !matched.result.unexpected_keys.empty())) {
    std::string message = "load_into (strict):";
    if (!matched.result.missing_keys.empty()) {
      // Appended piece by piece: GCC 12's -Wrestrict misfires on `" " + std::string` (C++20).
      message += ' ';
      message += std::to_string(matched.result.missing_keys.size());
      message += " destination(s) with no tensor in the checkpoint: ";
      message += format::some_names(matched.result.missing_keys) + ";";
    }
    if (!matched.result.unexpected_keys.empty()) {
      message += ' ';
      message += std::to_string(matched.result.unexpected_keys.size());
      message += " tensor(s) of the checkpoint with no destination: ";
      message += format::some_names(matched.result.unexpected_keys) + ";";
    }
    message += " pass strict=False to fill the names both sides have";
    throw Error(ErrorKind::Key, first_file, "", message);
  }
  for (const auto& fill : matched.fills) check_destination(checkpoint, fill);
  // No two destinations may share a byte: the later read would overwrite the earlier one.
  std::vector<std::tuple<c10::Device, uintptr_t, uintptr_t, const Fill*>> extents;
  for (const auto& fill : matched.fills) {
    if (fill.destination.numel() == 0) continue;
    auto [begin, end] = byte_extent(fill.destination);
    extents.emplace_back(fill.destination.device(), begin, end, &fill);
  }
  std::sort(extents.begin(), extents.end(), [](const auto& a, const auto& b) {
    return std::make_tuple(std::get<0>(a).type(), std::get<0>(a).index(), std::get<1>(a)) <
           std::make_tuple(std::get<0>(b).type(), std::get<0>(b).index(), std::get<1>(b));
  });
  for (size_t i = 1; i < extents.size(); ++i) {
    const auto& [device_a, begin_a, end_a, fill_a] = extents[i - 1];
    const auto& [device_b, begin_b, end_b, fill_b] = extents[i];
    if (device_a == device_b && begin_b < end_a) {
      throw Error(ErrorKind::Argument, checkpoint.path_of(*fill_b->source), fill_b->source->name(),
                  "load_into: the destination shares memory with the destination of '" +
                      fill_a->source->name() + "'");
    }
  }
  return matched;
}

}  // namespace instanttensor::loader

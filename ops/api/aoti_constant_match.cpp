#include "api/aoti_constant_match.h"

#include "format/message_text.h"
#include "format/torch_dtype.h"
#include "instanttensor/error.h"

namespace instanttensor::aoti {

namespace {

using format::shape_text;

// Quoted: names hold dots and commas.
std::string name_list(const std::vector<std::string>& names) {
  std::vector<std::string> quoted;
  for (const auto& name : names) quoted.push_back("'" + name + "'");
  return format::some_names(quoted, 8);
}

void check_shape(const ConstantSource& pair, const std::vector<int64_t>& expected) {
  if (pair.source->shape == expected) return;
  throw Error(ErrorKind::Argument, pair.source->file, pair.tensor,
              "the package's constant '" + pair.constant->fqn + "' has shape " +
                  shape_text(expected) + ", the checkpoint's tensor " +
                  shape_text(pair.source->shape));
}

}  // namespace

ConstantMatch match_constants(const std::vector<PackageConstant>& constants,
                              const std::map<std::string, CheckpointTensor>& tensors,
                              const std::function<std::string(const std::string&)>& checkpoint_name,
                              bool strict, const std::string& files) {
  ConstantMatch match;
  std::vector<std::string> missing;
  std::map<std::string, const PackageConstant*> taken;  // tensor -> the constant that takes it
  for (const auto& constant : constants) {
    std::string tensor = checkpoint_name(constant.fqn);
    auto found = tensors.find(tensor);
    if (found == tensors.end()) {
      missing.push_back(constant.fqn == tensor ? tensor : constant.fqn + " (as '" + tensor + "')");
      continue;
    }
    auto [other, first] = taken.emplace(tensor, &constant);
    if (!first) {
      throw Error(ErrorKind::Argument, found->second.file, tensor,
                  "both constants '" + other->second->fqn + "' and '" + constant.fqn +
                      "' name this tensor");
    }
    match.sources.push_back({&constant, tensor, &found->second});
  }
  if (!missing.empty()) {
    throw Error(ErrorKind::Key, files, "",
                std::to_string(missing.size()) + " of the package's " +
                    std::to_string(constants.size()) +
                    " constants have no tensor in the checkpoint: " + name_list(missing));
  }
  for (const auto& [name, tensor] : tensors) {
    if (taken.count(name) == 0) match.unused_tensors.push_back(name);
  }
  if (strict && !match.unused_tensors.empty()) {
    throw Error(ErrorKind::Key, files, "",
                std::to_string(match.unused_tensors.size()) +
                    " checkpoint tensors are no constant of the package (strict=false leaves "
                    "them unread): " +
                    name_list(match.unused_tensors));
  }
  for (const auto& pair : match.sources) {
    if (pair.source->dtype != pair.constant->dtype) {
      throw Error(ErrorKind::Argument, pair.source->file, pair.tensor,
                  "the package's constant '" + pair.constant->fqn + "' is " +
                      format::torch_dtype_name(pair.constant->dtype) +
                      ", the checkpoint's tensor " + format::torch_dtype_name(pair.source->dtype));
    }
    if (pair.constant->shape) check_shape(pair, *pair.constant->shape);
  }
  return match;
}

void check_shapes(const ConstantMatch& match,
                  const std::map<std::string, std::vector<int64_t>>& package_shapes) {
  for (const auto& pair : match.sources) {
    auto found = package_shapes.find(pair.constant->fqn);
    if (found == package_shapes.end()) {
      throw Error(ErrorKind::Internal, pair.source->file, pair.tensor,
                  "the package gave no buffer for its constant '" + pair.constant->fqn + "'");
    }
    check_shape(pair, found->second);
  }
}

}  // namespace instanttensor::aoti

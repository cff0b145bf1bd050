// Which checkpoint tensor fills which constant of an AOTInductor package, checked before any byte
// is read: names both ways, dtypes, shapes. Pure (no package, no file): tested as a table.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace instanttensor::aoti {

// A constant as the package states it: its internal name (the runner's key), its FQN (the
// state_dict name), dtype, and shape where known (the package states no shapes until one of its
// buffers is loaded).
struct PackageConstant {
  std::string name;
  std::string fqn;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::optional<std::vector<int64_t>> shape;
};

// A checkpoint tensor as its header states it (torch dtype and shape) and the file holding it.
struct CheckpointTensor {
  std::string file;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::vector<int64_t> shape;
};

// One constant and the tensor that fills it.
struct ConstantSource {
  const PackageConstant* constant = nullptr;
  std::string tensor;  // the checkpoint's name
  const CheckpointTensor* source = nullptr;
};

struct ConstantMatch {
  std::vector<ConstantSource> sources;      // in the package's order
  std::vector<std::string> unused_tensors;  // checkpoint tensors no constant takes, sorted
};

// Pairs every constant with checkpoint_name(fqn). Throws Error naming the constant and the file:
// Key for a constant without a tensor (all of them listed) and, when `strict`, for tensors no
// constant takes (listed); Argument for two constants naming one tensor, a dtype that differs,
// or a shape that differs where the constant's shape is known. `files` names the checkpoint in
// errors not tied to one file. The result points into `constants` and `tensors`.
ConstantMatch match_constants(const std::vector<PackageConstant>& constants,
                              const std::map<std::string, CheckpointTensor>& tensors,
                              const std::function<std::string(const std::string&)>& checkpoint_name,
                              bool strict, const std::string& files);

// Throws Error(Argument) naming the constant, its tensor and file when the shape the package
// gives a constant (by FQN) differs from its tensor's, or the package gives none.
void check_shapes(const ConstantMatch& match,
                  const std::map<std::string, std::vector<int64_t>>& package_shapes);

}  // namespace instanttensor::aoti

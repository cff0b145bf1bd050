// Helpers for loader tests: a checkpoint written from known tensors.
#pragma once

#include <instanttensor/instanttensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "helper_files.h"

namespace instanttensor::testing {

struct Model {
  std::vector<std::string> files;             // in the order the shards were given
  std::map<std::string, at::Tensor> tensors;  // every tensor of every shard, by name
  uint64_t largest = 0;                       // bytes of the largest tensor
  uint64_t total = 0;                         // bytes of all tensors
};

// Writes each (file name, tensors) shard into `dir` with save_file and describes the result.
inline Model save_shards(
    const TempDir& dir,
    const std::vector<std::pair<std::string, std::map<std::string, at::Tensor>>>& shards) {
  Model model;
  for (const auto& [file, tensors] : shards) {
    save_file(tensors, dir.file(file));
    model.files.push_back(dir.file(file));
    for (const auto& [name, tensor] : tensors) {
      model.tensors[name] = tensor;
      model.largest = std::max<uint64_t>(model.largest, tensor.nbytes());
      model.total += tensor.nbytes();
    }
  }
  return model;
}

}  // namespace instanttensor::testing

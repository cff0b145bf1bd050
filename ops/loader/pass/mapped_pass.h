// The pass of backend="mmap" with copy=false: each tensor is a view of the file mapping for its
// whole life, like safetensors' and torch.load(mmap=True)'s; nothing is read, no ring, no copy.
#pragma once

#include "io/io_setup.h"
#include "loader/access/tensor_factory.h"
#include "loader/pass/pass.h"

namespace instanttensor::loader {

class MappedPass : public Pass {
 public:
  // `io` (the mapping backend), `factory` and `stats` outlive the pass.
  MappedPass(const PassPlan& plan, const io::IoSetup& io, TensorFactory& factory, Stats& stats)
      : Pass(plan), io_(io), factory_(factory), stats_(stats) {}

  std::optional<Error> settle(size_t /*item*/) override { return std::nullopt; }
  std::pair<std::string, at::Tensor> hand_out(size_t item) override;

 private:
  const io::IoSetup& io_;
  TensorFactory& factory_;
  Stats& stats_;
};

}  // namespace instanttensor::loader

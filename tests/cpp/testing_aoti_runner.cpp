// Test-only: torch.classes.instanttensor_testing.LibraryRunner, torch's AOTIModelContainerRunner
// over a model library named by path (tests/aoti/fake_model_library.cpp, built by hand for any
// device), so that instanttensor::load_constants on a runner runs on the simulated device, for
// which AOTInductor cannot compile.
#include <torch/custom_class.h>
#include <torch/library.h>

#include "instanttensor/aoti.h"

namespace {

// The runner's constructor from a library path is protected: for devices without a runner of
// their own.
class LibraryRunner : public torch::inductor::AOTIModelContainerRunner {
 public:
  LibraryRunner(const std::string& library, const std::string& device)
      : AOTIModelContainerRunner(library, /*num_models=*/1, device, /*cubin_dir=*/"",
                                 /*run_single_threaded=*/false) {}
};

class LibraryRunnerHolder : public torch::CustomClassHolder {
 public:
  LibraryRunnerHolder(const std::string& library, const std::string& device)
      : device_(device), runner_(library, device) {}

  // (FQNs filled, bytes written)
  std::tuple<std::vector<std::string>, int64_t> load_constants(std::vector<std::string> files,
                                                               bool use_inactive,
                                                               bool force_staging,
                                                               std::optional<int64_t> staging_size,
                                                               std::optional<std::string> backend) {
    instanttensor::ConstantsOptions options;
    options.use_inactive = use_inactive;
    options.open.force_staging = force_staging;
    options.open.staging_size = staging_size;
    options.open.backend = std::move(backend);
    options.open.print_warnings = false;
    auto report = instanttensor::load_constants(runner_, device_, files, options);
    return {std::move(report.constants), static_cast<int64_t>(report.bytes)};
  }
  void swap_constant_buffer() { runner_.swap_constant_buffer(); }
  void free_inactive_constant_buffer() { runner_.free_inactive_constant_buffer(); }
  at::Tensor run(at::Tensor input) { return runner_.run({std::move(input)}).at(0); }
  // The constants the runner holds (FQN -> tensor), active or inactive.
  c10::Dict<std::string, at::Tensor> constants(bool use_inactive) {
    c10::Dict<std::string, at::Tensor> out;
    for (const auto& [fqn, tensor] : runner_.extract_constants_map(use_inactive)) {
      out.insert(fqn, tensor);
    }
    return out;
  }

 private:
  c10::Device device_;
  LibraryRunner runner_;
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(instanttensor_testing, m) {
  m.class_<LibraryRunnerHolder>("LibraryRunner")
      .def(torch::init<std::string, std::string>())
      .def("load_constants", &LibraryRunnerHolder::load_constants, "",
           {torch::arg("files"), torch::arg("use_inactive") = false,
            torch::arg("force_staging") = false, torch::arg("staging_size") = torch::arg::none(),
            torch::arg("backend") = torch::arg::none()})
      .def("swap_constant_buffer", &LibraryRunnerHolder::swap_constant_buffer)
      .def("free_inactive_constant_buffer", &LibraryRunnerHolder::free_inactive_constant_buffer)
      .def("run", &LibraryRunnerHolder::run)
      .def("constants", &LibraryRunnerHolder::constants);
}

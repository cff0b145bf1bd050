#include "api/aoti_package_class.h"

#include <torch/custom_class.h>

#include "instanttensor/aoti.h"

namespace instanttensor {

namespace {

// Python and TorchScript's handle on a package: torch::inductor::AOTIModelPackageLoader plus
// load_constants. Methods run without the GIL, so a Python thread can run() while another loads
// the inactive buffer; one load at a time per package (the caller's to keep).
class AOTIPackageHolder : public torch::CustomClassHolder {
 public:
  AOTIPackageHolder(const std::string& path, const std::string& model_name, int64_t device_index)
      : package_(path, model_name, /*run_single_threaded=*/false, /*num_runners=*/1,
                 static_cast<c10::DeviceIndex>(device_index)) {}

  // (FQNs filled, checkpoint tensors left unread, bytes written). `names` maps an FQN to its
  // checkpoint name where given (Python's rename=, evaluated there); else prefix + FQN.
  std::tuple<std::vector<std::string>, std::vector<std::string>, int64_t> load_constants(
      std::vector<std::string> files, std::string prefix,
      std::optional<c10::Dict<std::string, std::string>> names, bool strict, bool use_inactive,
      std::optional<std::string> backend, std::optional<int64_t> concurrency,
      std::optional<int64_t> staging_size) {
    ConstantsOptions options;
    options.prefix = std::move(prefix);
    if (names) {
      std::map<std::string, std::string> table;
      for (const auto& item : *names) table.emplace(item.key(), item.value());
      options.rename = [table = std::move(table), prefix = options.prefix](const std::string& fqn) {
        auto found = table.find(fqn);
        return found == table.end() ? prefix + fqn : found->second;
      };
    }
    options.strict = strict;
    options.use_inactive = use_inactive;
    options.open.backend = std::move(backend);
    options.open.concurrency = concurrency;
    options.open.staging_size = staging_size;
    options.open.print_warnings = false;
    auto report = instanttensor::load_constants(package_, files, options);
    return {std::move(report.constants), std::move(report.unused_tensors),
            static_cast<int64_t>(report.bytes)};
  }

  void swap_constant_buffer() { package_.get_runner()->swap_constant_buffer(); }
  void free_inactive_constant_buffer() { package_.get_runner()->free_inactive_constant_buffer(); }
  std::vector<at::Tensor> run(std::vector<at::Tensor> inputs) { return package_.run(inputs); }
  std::vector<std::string> get_constant_fqns() {
    auto fqns = package_.get_constant_fqns();
    std::sort(fqns.begin(), fqns.end());
    return fqns;
  }
  std::vector<std::string> get_call_spec() { return package_.get_call_spec(); }
  c10::Dict<std::string, std::string> get_metadata() {
    c10::Dict<std::string, std::string> out;
    for (const auto& [key, value] : package_.get_metadata()) out.insert(key, value);
    return out;
  }

 private:
  torch::inductor::AOTIModelPackageLoader package_;
};

}  // namespace

void define_aoti_package_class(torch::Library& m) {
  m.class_<AOTIPackageHolder>("AOTIPackage")
      .def(torch::init<std::string, std::string, int64_t>(),
           "Opens an AOTInductor package (.pt2) compiled without its constants.",
           {torch::arg("path"), torch::arg("model_name") = std::string("model"),
            torch::arg("device_index") = -1})
      .def("load_constants", &AOTIPackageHolder::load_constants, "",
           {torch::arg("files"), torch::arg("prefix") = std::string(),
            torch::arg("names") = torch::arg::none(), torch::arg("strict") = true,
            torch::arg("use_inactive") = false, torch::arg("backend") = torch::arg::none(),
            torch::arg("concurrency") = torch::arg::none(),
            torch::arg("staging_size") = torch::arg::none()})
      .def("swap_constant_buffer", &AOTIPackageHolder::swap_constant_buffer)
      .def("free_inactive_constant_buffer", &AOTIPackageHolder::free_inactive_constant_buffer)
      .def("run", &AOTIPackageHolder::run)
      .def("get_constant_fqns", &AOTIPackageHolder::get_constant_fqns)
      .def("get_call_spec", &AOTIPackageHolder::get_call_spec)
      .def("get_metadata", &AOTIPackageHolder::get_metadata);
}

}  // namespace instanttensor

#include "api/aoti_package_class.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/custom_class.h>
#include <unistd.h>

#include <cerrno>
#include <limits>
#include <mutex>

#include "instanttensor/aoti.h"

namespace instanttensor {

namespace {

// The package at `path`, or an Error naming the path (torch's loader says neither which file
// nor, for a missing one, that it is missing).
std::unique_ptr<torch::inductor::AOTIModelPackageLoader> open_package(const std::string& path,
                                                                      const std::string& model_name,
                                                                      int64_t device_index) {
  if (device_index < -1 || device_index > std::numeric_limits<c10::DeviceIndex>::max()) {
    throw Error(ErrorKind::Argument, path, "",
                "device_index=" + std::to_string(device_index) + " is not a device index");
  }
  if (access(path.c_str(), R_OK) != 0) throw system_error(errno, path, "cannot open the package");
  try {
    return std::make_unique<torch::inductor::AOTIModelPackageLoader>(
        path, model_name, /*run_single_threaded=*/false, /*num_runners=*/1,
        static_cast<c10::DeviceIndex>(device_index));
  } catch (const std::exception& error) {
    throw Error(ErrorKind::Format, path, "",
                std::string("not an AOTInductor package torch can load: ") + error.what());
  }
}

// Python and TorchScript's handle on a package: torch::inductor::AOTIModelPackageLoader plus
// load_constants. Methods run without the GIL, so a Python thread can run() while another loads
// the inactive buffer. Loads, swaps and frees of the inactive buffer take turns (a swap or free
// during a load would serve partial weights or free the memory being filled); run() does not
// wait for them.
class AOTIPackageHolder : public torch::CustomClassHolder {
 public:
  AOTIPackageHolder(const std::string& path, const std::string& model_name, int64_t device_index)
      : package_(open_package(path, model_name, device_index)) {
    auto metadata = package_->get_metadata();
    auto key = metadata.find("AOTI_DEVICE_KEY");
    if (key == metadata.end() || key->second.empty()) {
      throw Error(ErrorKind::Format, path, "", "the package's metadata names no device");
    }
    device_ = c10::Device(key->second);
    if (!device_.is_cpu()) {
      // The package took its device when it was opened (AOTInductor records the current one
      // for -1): loads from any thread go there, whatever that thread's current device.
      device_.set_index(device_index >= 0
                            ? static_cast<c10::DeviceIndex>(device_index)
                            : c10::impl::getDeviceGuardImpl(device_.type())->getDevice().index());
    }
  }

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
    std::lock_guard<std::mutex> turn(buffers_mutex_);
    auto report = instanttensor::load_constants(*package_->get_runner(), device_, files, options);
    return {std::move(report.constants), std::move(report.unused_tensors),
            static_cast<int64_t>(report.bytes)};
  }

  void swap_constant_buffer() {
    std::lock_guard<std::mutex> turn(buffers_mutex_);
    package_->get_runner()->swap_constant_buffer();
  }
  void free_inactive_constant_buffer() {
    std::lock_guard<std::mutex> turn(buffers_mutex_);
    package_->get_runner()->free_inactive_constant_buffer();
  }
  std::vector<at::Tensor> run(std::vector<at::Tensor> inputs) { return package_->run(inputs); }
  std::vector<std::string> get_constant_fqns() {
    auto fqns = package_->get_constant_fqns();
    std::sort(fqns.begin(), fqns.end());
    return fqns;
  }
  std::vector<std::string> get_call_spec() { return package_->get_call_spec(); }
  c10::Dict<std::string, std::string> get_metadata() {
    c10::Dict<std::string, std::string> out;
    for (const auto& [key, value] : package_->get_metadata()) out.insert(key, value);
    return out;
  }

 private:
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> package_;
  c10::Device device_{c10::kCPU};
  std::mutex buffers_mutex_;  // loads, swaps and frees take turns
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

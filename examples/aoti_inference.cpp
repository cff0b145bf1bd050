// A C++ inference app on AOTInductor: the compiled model from a .pt2 package, its weights from
// safetensors checkpoints through instanttensor, inputs from a safetensors file.
//   aoti_inference MODEL.pt2 WEIGHTS.safetensors INPUTS.safetensors [OUTPUTS.safetensors]
//                  [--prefix P] [--swap NEXT.safetensors]
// The package is compiled once in Python, without its weights:
//   torch._inductor.aoti_compile_and_package(torch.export.export(model, example_inputs),
//       package_path="model.pt2", inductor_configs={"aot_inductor.package_constants_in_so": False})
// INPUTS holds the model's inputs in storage order. The outputs are printed (shape, checksum) and,
// given OUTPUTS, saved there. --swap loads NEXT into the inactive buffer on a second thread while
// this one keeps running the model, then swaps it in and runs once more.
#include <instanttensor/aoti.h>

#include <atomic>
#include <cstring>
#include <iostream>
#include <thread>

namespace {

std::vector<at::Tensor> run_and_print(torch::inductor::AOTIModelPackageLoader& package,
                                      const std::vector<at::Tensor>& inputs) {
  auto outputs = package.run(inputs);
  for (size_t i = 0; i < outputs.size(); ++i) {
    std::cout << "output" << i << " " << outputs[i].sizes()
              << " sum=" << outputs[i].to(at::kCPU).to(at::kDouble).sum().item<double>() << "\n";
  }
  return outputs;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> positional;
  instanttensor::ConstantsOptions options;
  std::string next;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--prefix") == 0 && i + 1 < argc) {
      options.prefix = argv[++i];
    } else if (std::strcmp(argv[i], "--swap") == 0 && i + 1 < argc) {
      next = argv[++i];
    } else {
      positional.emplace_back(argv[i]);
    }
  }
  if (positional.size() < 3 || positional.size() > 4) {
    std::cerr << "usage: " << argv[0]
              << " MODEL.pt2 WEIGHTS.safetensors INPUTS.safetensors [OUTPUTS.safetensors]"
                 " [--prefix P] [--swap NEXT.safetensors]\n";
    return 2;
  }
  try {
    torch::inductor::AOTIModelPackageLoader package(positional[0]);
    auto report = instanttensor::load_constants(package, {positional[1]}, options);
    std::cout << "loaded " << report.constants.size() << " constants, " << report.bytes
              << " bytes\n";

    // The inputs on the package's device ("cpu", "cuda", ...: its metadata says).
    c10::Device device(package.get_metadata().at("AOTI_DEVICE_KEY"));
    std::vector<at::Tensor> inputs;
    instanttensor::SafeOpen input_file(positional[2]);
    for (auto& [name, tensor] : input_file)
      inputs.push_back(tensor.to(device, /*non_blocking=*/false, /*copy=*/true));
    auto outputs = run_and_print(package, inputs);

    if (!next.empty()) {
      // The refresh of a serving model: reads into the inactive buffer overlap the runs.
      instanttensor::ConstantsOptions refresh = options;
      refresh.use_inactive = true;
      std::atomic<bool> loaded{false};
      std::exception_ptr failure;
      std::thread loader([&] {
        try {
          instanttensor::load_constants(package, {next}, refresh);
        } catch (...) {
          failure = std::current_exception();
        }
        loaded = true;
      });
      int64_t served = 0;
      while (!loaded) {
        package.run(inputs);
        ++served;
      }
      loader.join();
      if (failure) std::rethrow_exception(failure);
      package.get_runner()->swap_constant_buffer();
      package.get_runner()->free_inactive_constant_buffer();
      std::cout << "swapped in " << next << " after " << served << " runs during its load\n";
      outputs = run_and_print(package, inputs);
    }
    if (positional.size() == 4) {
      std::map<std::string, at::Tensor> named;
      for (size_t i = 0; i < outputs.size(); ++i) {
        named.emplace("output" + std::to_string(i),
                      outputs[i].contiguous());  // saved from any device
      }
      instanttensor::save_file(named, positional[3]);
    }
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}

// A pure C++ libtorch program: load a safetensors checkpoint and print every tensor's name,
// dtype, shape and a checksum of its bytes.
//   load_checkpoint [--into] model.safetensors [more.safetensors ...]
// --into allocates the tensors first (as a model's parameters would be) and fills them in place
// with SafeOpen::load_into instead of iterating.
#include <instanttensor/instanttensor.h>

#include <cstdio>
#include <cstring>
#include <iostream>

namespace {

void print(const std::string& name, const at::Tensor& tensor) {
  // FNV-1a over the raw bytes: identical bytes give identical sums in any reader.
  uint64_t sum = 1469598103934665603ull;
  const auto* bytes = static_cast<const uint8_t*>(tensor.data_ptr());
  for (size_t i = 0; i < tensor.nbytes(); ++i) sum = (sum ^ bytes[i]) * 1099511628211ull;
  std::cout << name << " " << tensor.dtype() << " " << tensor.sizes() << " fnv1a=" << std::hex
            << sum << std::dec << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  bool into = argc > 1 && std::strcmp(argv[1], "--into") == 0;
  int first = into ? 2 : 1;
  if (argc <= first) {
    std::cerr << "usage: " << argv[0] << " [--into] FILE.safetensors [FILE ...]\n";
    return 2;
  }
  try {
    instanttensor::SafeOpen checkpoint(std::vector<std::string>(argv + first, argv + argc));
    if (into) {
      std::map<std::string, at::Tensor> parameters;
      for (const auto& name : checkpoint.keys()) {
        auto meta = checkpoint.get_tensor_metadata(name);
        parameters[name] = at::empty(meta.shape, at::TensorOptions().dtype(meta.dtype));
      }
      checkpoint.load_into(parameters);  // in place, one pass over the bytes
      for (const auto& [name, tensor] : parameters) print(name, tensor);
    } else {
      for (auto& [name, tensor] : checkpoint) print(name, tensor);
    }
  } catch (const instanttensor::Error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}

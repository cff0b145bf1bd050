// A pure C++ libtorch program: load a safetensors checkpoint and print every tensor's name,
// dtype, shape and a checksum of its bytes.
//   load_checkpoint model.safetensors [more.safetensors ...]
#include <instanttensor/instanttensor.h>

#include <cstdio>
#include <iostream>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: " << argv[0] << " FILE.safetensors [FILE ...]\n";
    return 2;
  }
  try {
    instanttensor::SafeOpen checkpoint(std::vector<std::string>(argv + 1, argv + argc));
    for (auto& [name, tensor] : checkpoint) {
      // FNV-1a over the raw bytes: identical bytes give identical sums in any reader.
      uint64_t sum = 1469598103934665603ull;
      const auto* bytes = static_cast<const uint8_t*>(tensor.data_ptr());
      for (size_t i = 0; i < tensor.nbytes(); ++i) sum = (sum ^ bytes[i]) * 1099511628211ull;
      std::cout << name << " " << tensor.dtype() << " " << tensor.sizes() << " fnv1a=" << std::hex
                << sum << std::dec << "\n";
    }
  } catch (const instanttensor::Error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}

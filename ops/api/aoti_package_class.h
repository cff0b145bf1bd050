// torch.classes.instanttensor.AOTIPackage: an AOTInductor package opened by instanttensor, whose
// constants come from checkpoints (load_constants), with the swap torch's Python binding lacks.
#pragma once

#include <torch/library.h>

namespace instanttensor {

// Defines the class in the instanttensor library (TORCH_LIBRARY's `m`). Called once, from the
// library's static registration.
void define_aoti_package_class(torch::Library& m);

}  // namespace instanttensor

// torch.classes.instanttensor.Loader: SafeOpen for Python and TorchScript (which cannot for-loop
// over a class: it steps with next() until None).
#pragma once

#include <torch/library.h>

namespace instanttensor {

// Defines the class and its methods in the instanttensor library (TORCH_LIBRARY's `m`). Called
// once, from the library's static registration.
void define_loader_class(torch::Library& m);

}  // namespace instanttensor

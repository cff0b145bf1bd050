// The Python face of the simulated device's collectives: `instanttensor_simccl.create_backend`,
// for torch.distributed.Backend.register_backend (tests/python/simulated_device.py registers it
// as "simccl" for the "simdev" device). A Python extension module, apart from the simulated
// device's library, which links torch only.
#include <torch/csrc/utils/pybind.h>

#include "sim_collectives.h"

PYBIND11_MODULE(instanttensor_simccl, module) {
  // c10d's Python types (Backend) must be registered before one is returned.
  pybind11::module_::import("torch.distributed");
  module.def(
      "create_backend",
      [](c10::intrusive_ptr<c10d::Backend> host, int rank, int size) {
        return c10::intrusive_ptr<c10d::Backend>(
            c10::make_intrusive<simdev::CollectiveBackend>(std::move(host), rank, size));
      },
      "A simccl backend over `host` (a gloo backend of the same ranks, which carries the bytes).",
      pybind11::arg("host"), pybind11::arg("rank"), pybind11::arg("size"));
  module.def(
      "pending",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) -> int64_t {
        auto* ours = dynamic_cast<simdev::CollectiveBackend*>(backend.get());
        TORCH_CHECK(ours != nullptr, "not a simccl backend");
        return static_cast<int64_t>(ours->pending());
      },
      "Collectives issued on `backend` and not yet carried.");
}

// instanttensor for AOTInductor: a constants-free package's weights from safetensors checkpoints.
//
//   // Python, once: torch._inductor.aoti_compile_and_package(exported, package_path="model.pt2",
//   //   inductor_configs={"aot_inductor.package_constants_in_so": False})
//   torch::inductor::AOTIModelPackageLoader package("model.pt2");
//   instanttensor::load_constants(package, {"model.safetensors"});
//   auto outputs = package.run({input});
//
// Swap while serving (the weight refresh of RL loops and hot updates): one thread keeps running
// the package while another loads the next checkpoint into the inactive buffer, then swaps:
//
//   instanttensor::ConstantsOptions next;
//   next.use_inactive = true;
//   instanttensor::load_constants(package, {"step-42.safetensors"}, next);
//   package.get_runner()->swap_constant_buffer();          // waits for runs underway (host)
//   package.get_runner()->free_inactive_constant_buffer();  // the old weights' memory
#pragma once

#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/csrc/inductor/aoti_runner/model_container_runner.h>

#include <functional>
#include <string>
#include <vector>

#include "instanttensor/instanttensor.h"

namespace instanttensor {

struct ConstantsOptions {
  // How the checkpoint is read (backend, threads, staging ring...). `device` and `keys` are
  // ignored: the package's device, and exactly the tensors its constants name.
  OpenOptions open;
  // The checkpoint's name of a constant is prefix + its FQN ("model." for a checkpoint saved from
  // a wrapper module), or rename(FQN) when rename is set (prefix is then ignored).
  std::string prefix;
  std::function<std::string(const std::string& fqn)> rename;
  // true (default): a checkpoint tensor no constant takes is Error(Key), as a constant the
  // checkpoint lacks always is. false: such tensors are left unread.
  bool strict = true;
  // false (default): the active buffer, which run() uses. true: the inactive one, for
  // swap_constant_buffer() while runs on the active one go on.
  bool use_inactive = false;
};

// What a load did.
struct ConstantsReport {
  std::vector<std::string> constants;       // FQNs filled, sorted
  std::vector<std::string> unused_tensors;  // checkpoint tensors left unread (strict=false)
  uint64_t bytes = 0;                       // bytes written into the package's buffers
  Stats stats;                              // the read's counters
};

// Fills the constants of a package compiled with aot_inductor.package_constants_in_so=False
// from safetensors files, in one pass: only the constants' bytes are read, straight into the
// package's own buffers (CPU: read into them; an accelerator: through the pinned staging ring,
// one copy to the device, no device memory beyond the package's). The constants are those the
// package takes from outside: every one but those it folds at run time (runtime constant
// folding), non-persistent buffers included. They are filled contiguous, as torch's
// load_constants fills them from a state dict.
//
// Ownership: the package owns the weights (its constant buffer, as with torch's
// load_constants(user_managed=false)); nothing of instanttensor stays alive after the call and
// nothing is copied twice. The package's free_inactive_constant_buffer() and destructor free them.
//
// Checked before any buffer of the package changes, each an Error naming the constant and the
// file: a constant with no tensor in the checkpoint (Key), a checkpoint tensor no constant takes
// when strict (Key), a dtype or shape that differs from the package's (Argument; the shapes are
// the package's once a buffer of it was loaded, else the shape check comes after its buffer is
// allocated), a package whose library carries its weights' bytes (compiled with its constants
// inside, torch's default: Argument; not checked for a runner without a library), files that
// cannot be opened or parsed.
//
// A failure after that (the package refuses the device given, its buffer cannot be allocated:
// OutOfMemory, a shape learned from it differs, a read fails): use_inactive, the inactive buffer
// is freed and the active one keeps serving, untouched; otherwise the active buffer is left
// refusing to run (run() raises "Unknown constant state") rather than serving a partial or
// unchecked set of weights, until a load succeeds.
//
// Device: the package's buffers are allocated on the current device unless `device` (the runner
// overload) names an index; call from a thread whose current device is the package's.
// use_inactive waits for the device (runs queued on it may still read a buffer swapped out) and
// frees the inactive buffer first. Returns after every byte is in place (device
// copies complete).
//
// Threads: one load per package at a time, and no swap_constant_buffer() or
// free_inactive_constant_buffer() during it (they would put partial weights in service or free
// the memory being filled; the Python class serializes the three). With use_inactive, run() may
// be called from other threads during the load (the active buffer is not touched), but not the
// package's first run() (which folds constants into the active buffer).
ConstantsReport load_constants(torch::inductor::AOTIModelPackageLoader& package,
                               const std::vector<std::string>& files,
                               const ConstantsOptions& options = {});

// The same on a runner (AOTIModelPackageLoader::get_runner(), or one built directly), whose
// device is `device` (CPU, or the accelerator the runner was created for).
ConstantsReport load_constants(torch::inductor::AOTIModelContainerRunner& runner,
                               c10::Device device, const std::vector<std::string>& files,
                               const ConstantsOptions& options = {});

}  // namespace instanttensor

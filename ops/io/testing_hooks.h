// Whether this library carries the test switches (CMake's INSTANTTENSOR_TESTING_HOOKS: fault
// injection in io/fault_injection.h, fence dropping, the INSTANTTENSOR_TESTING_* variables).
// Apart from fault_injection.h so that a source outside the hooked list can ask without seeing
// that header's release stubs.
#pragma once

namespace instanttensor::io {

// Any thread.
bool testing_hooks_built();

}  // namespace instanttensor::io

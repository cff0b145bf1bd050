// Test-only operators, built with the tests and never installed: they let Python tests (one
// process per rank) inject read faults through the C++ test API of ops/io/fault_injection.h.
#include <torch/library.h>

#include "io/fault_injection.h"

namespace {

// The `nth` read call from now on fails with `error` (an errno; 5 is EIO).
void arm_read_fault(int64_t nth, int64_t error) {
  instanttensor::io::FaultPlan plan;
  plan.fail_read_number = nth;
  plan.fail_errno = static_cast<int>(error);
  instanttensor::io::arm_faults(plan);
}

// Every read call from now on sleeps `ms` milliseconds first (a slow disk).
void arm_read_delay(int64_t ms) {
  instanttensor::io::FaultPlan plan;
  plan.delay_ms = static_cast<int>(ms);
  instanttensor::io::arm_faults(plan);
}

// Every read call from now on waits at a gate until release_held_reads().
void hold_reads() {
  instanttensor::io::FaultPlan plan;
  plan.hold_reads = true;
  instanttensor::io::arm_faults(plan);
}

// Only the `nth` read call from now on waits at the gate until release_held_reads().
void hold_read(int64_t nth) {
  instanttensor::io::FaultPlan plan;
  plan.hold_read_number = nth;
  instanttensor::io::arm_faults(plan);
}

// Blocks until a read call waits at the gate (returns at once if the gate is open).
void wait_for_held_read() { instanttensor::io::wait_for_held_read(); }

void release_held_reads() { instanttensor::io::release_held_reads(); }

void disarm_faults() { instanttensor::io::disarm_faults(); }

// Every madvise of `advice` (-1: any) from now on is refused with `error` (an errno; 22 is
// EINVAL, a kernel without the advice).
void arm_advice_refusal(int64_t advice, int64_t error) {
  instanttensor::io::FaultPlan plan;
  plan.refuse_advice = static_cast<int>(advice);
  plan.refuse_errno = static_cast<int>(error);
  instanttensor::io::arm_faults(plan);
}

}  // namespace

TORCH_LIBRARY(instanttensor_testing, m) {
  m.def("arm_read_fault(int nth, int error) -> ()", &arm_read_fault);
  m.def("arm_read_delay(int ms) -> ()", &arm_read_delay);
  m.def("disarm_faults() -> ()", &disarm_faults);
  m.def("arm_advice_refusal(int advice, int error) -> ()", &arm_advice_refusal);
  m.def("hold_reads() -> ()", &hold_reads);
  m.def("hold_read(int nth) -> ()", &hold_read);
  m.def("wait_for_held_read() -> ()", &wait_for_held_read);
  m.def("release_held_reads() -> ()", &release_held_reads);
}

#include "io/fault_injection.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "io/testing_hooks.h"

namespace instanttensor::io {

#ifdef INSTANTTENSOR_TESTING_HOOKS
bool testing_hooks_built() { return true; }

namespace {
std::atomic<bool> armed{false};  // the hot path pays one relaxed load when disarmed
std::mutex plan_mutex;
FaultPlan plan;
int64_t calls = 0;
int64_t uring_submits = 0;
std::condition_variable gate_changed;  // a read arrived at the gate, or the gate opened
int64_t reads_held = 0;
bool gate_open = true;

// A read call at the gate waits until it opens.
void pass_gate() {
  std::unique_lock<std::mutex> lock(plan_mutex);
  ++reads_held;
  gate_changed.notify_all();
  gate_changed.wait(lock, [] { return gate_open; });
  --reads_held;
}
}  // namespace

void arm_faults(const FaultPlan& new_plan) {
  std::lock_guard<std::mutex> lock(plan_mutex);
  plan = new_plan;
  calls = 0;
  uring_submits = 0;
  gate_open = !new_plan.hold_reads && new_plan.hold_read_number == 0;
  armed.store(true);
  gate_changed.notify_all();
}

void disarm_faults() {
  std::lock_guard<std::mutex> lock(plan_mutex);
  armed.store(false);
  gate_open = true;
  gate_changed.notify_all();
}

void wait_for_held_read() {
  std::unique_lock<std::mutex> lock(plan_mutex);
  gate_changed.wait(lock, [] { return reads_held > 0 || gate_open; });
}

void release_held_reads() {
  std::lock_guard<std::mutex> lock(plan_mutex);
  gate_open = true;
  gate_changed.notify_all();
}

int injected_fault(uint64_t* length) {
  if (!armed.load(std::memory_order_relaxed)) return 0;
  FaultPlan current;
  int64_t call;
  {
    std::lock_guard<std::mutex> lock(plan_mutex);
    if (!armed.load()) return 0;
    current = plan;
    call = ++calls;
  }
  if (current.hold_reads || current.hold_read_number == call) pass_gate();
  if (current.delay_ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(current.delay_ms));
  if (current.fail_read_number == call) return current.fail_errno;
  if (current.eintr_every > 0 && call % current.eintr_every == 0) return EINTR;
  if (current.eagain_every > 0 && call % current.eagain_every == 0) return EAGAIN;
  if (current.short_reads) {
    // Half, kept to whole 4 KiB blocks so O_DIRECT reads stay legal.
    uint64_t half = *length / 2 - (*length / 2) % 4096;
    if (half > 0) *length = half;
  }
  return 0;
}

bool injected_uring_setup_failure() {
  if (!armed.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(plan_mutex);
  return armed.load() && plan.fail_uring_setup;
}

int injected_uring_submit_failure() {
  if (!armed.load(std::memory_order_relaxed)) return 0;
  std::lock_guard<std::mutex> lock(plan_mutex);
  if (!armed.load() || plan.fail_uring_submit == 0) return 0;
  return ++uring_submits > plan.fail_uring_submit_after ? plan.fail_uring_submit : 0;
}

int injected_advice_refusal(int advice) {
  if (!armed.load(std::memory_order_relaxed)) return 0;
  std::lock_guard<std::mutex> lock(plan_mutex);
  if (!armed.load() || plan.refuse_advice == 0) return 0;
  return plan.refuse_advice == -1 || plan.refuse_advice == advice ? plan.refuse_errno : 0;
}

#else
bool testing_hooks_built() { return false; }
#endif

}  // namespace instanttensor::io

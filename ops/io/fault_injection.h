// Test-only fault injection for the read path. Nothing reads the environment: only code that
// includes this header and arms a plan (the test suites) can make reads fail. It exists only in
// a library built with INSTANTTENSOR_TESTING_HOOKS (CMake option of that name, on for the test
// builds): in a release build the backends' questions below are constant answers the compiler
// removes, and arm_faults is not there to call.
#pragma once

#include <cstdint>

namespace instanttensor::io {

struct FaultPlan {
  int64_t fail_read_number = 0;     // the Nth read call (1-based) fails with fail_errno; 0: never
  int fail_errno = 5;               // EIO
  bool short_reads = false;         // every read call transfers at most half of what it asked
  int eintr_every = 0;              // every k-th read call fails with EINTR first (retried)
  int eagain_every = 0;             // every k-th read call fails with EAGAIN first (retried)
  int delay_ms = 0;                 // sleep before every read call
  bool fail_uring_setup = false;    // io_uring setup reports EPERM, as under a seccomp filter
  int fail_uring_submit = 0;        // io_uring submits report this errno; 0: never
  int fail_uring_submit_after = 0;  // ... once this many submits have worked
  // Every read call waits before reading until release_held_reads() (a gate the test opens, so
  // it can act while a load is surely underway).
  bool hold_reads = false;
  // Only the Nth read call (1-based) waits at that gate; 0: none (hold_reads holds them all).
  // For the pread workers: io_uring injects its faults in the consumer's own wait.
  int64_t hold_read_number = 0;
  // Every madvise of this advice (MADV_DONTNEED, ...; -1: any) is refused with refuse_errno
  // instead of made (io/memory_advice.h); 0: never (so MADV_NORMAL, which is 0, is refused
  // only with the rest, by -1).
  int refuse_advice = 0;
  int refuse_errno = 22;  // EINVAL, as a kernel without the advice answers
};

#ifdef INSTANTTENSOR_TESTING_HOOKS
// Arms `plan` for every read from now on (any thread; process-wide) and resets the call
// counter. disarm_faults() restores normal reads.
void arm_faults(const FaultPlan& plan);
void disarm_faults();
// With hold_reads or hold_read_number armed: blocks until a read call is waiting at the gate.
void wait_for_held_read();
// Opens the gate: waiting and later read calls go on (until the next arm_faults). Also done by
// disarm_faults().
void release_held_reads();

// Used by the backends: what the next read call should do instead of reading, or 0 to read.
// Returns an errno to report, and may shorten `length` or sleep.
int injected_fault(uint64_t* length);
bool injected_uring_setup_failure();
// The errno an io_uring submit should report instead of submitting, or 0.
int injected_uring_submit_failure();
// The errno a madvise of `advice` should report instead of advising, or 0.
int injected_advice_refusal(int advice);
#else
inline int injected_fault(uint64_t*) { return 0; }
inline bool injected_uring_setup_failure() { return false; }
inline int injected_uring_submit_failure() { return 0; }
inline int injected_advice_refusal(int) { return 0; }
#endif

}  // namespace instanttensor::io

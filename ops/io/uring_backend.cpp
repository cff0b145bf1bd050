#include <cerrno>
#include <chrono>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "instanttensor/error.h"
#include "io/fault_injection.h"
#include "io/read_backend.h"

#ifdef INSTANTTENSOR_HAVE_LIBURING
#include <liburing.h>
#endif

namespace instanttensor::io {

#ifdef INSTANTTENSOR_HAVE_LIBURING
namespace {

class UringBackend final : public ReadBackend {
 public:
  explicit UringBackend(unsigned depth) : depth_(depth < 1 ? 1 : depth) {
    int rc = injected_uring_setup_failure() ? -EPERM : io_uring_queue_init(depth_, &ring_, 0);
    if (rc < 0) {
      throw Error(ErrorKind::Io, "", "",
                  std::string("io_uring is unavailable: ") + errno_message(-rc));
    }
    slots_.resize(depth_);
    for (unsigned i = 0; i < depth_; ++i) free_slots_.push_back(i);
  }

  ~UringBackend() override {
    // Reads still in the kernel write into the owner's buffers: reap them before returning (a
    // signal interrupting the wait is no reason to stop). Entries prepared but never submitted
    // reach no buffer.
    while (in_kernel_ > 0) {
      io_uring_cqe* cqe = nullptr;
      int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) break;
      io_uring_cqe_seen(&ring_, cqe);
      --in_kernel_;
    }
    io_uring_queue_exit(&ring_);
  }

  void submit(const ReadRequest& request) override {
    if (!broken_.empty()) throw Error(ErrorKind::Io, "", "", broken_);
    ++in_flight_;
    backlog_.push_back(request);
    fill();
  }

  ReadCompletion wait_completion() override {
    for (;;) {
      submit_or_throw();
      io_uring_cqe* cqe = nullptr;
      int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0)
        throw Error(ErrorKind::Io, "", "",
                    std::string("io_uring wait failed: ") + errno_message(-rc));
      unsigned index = static_cast<unsigned>(io_uring_cqe_get_data64(cqe));
      int result = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      uint64_t allowed = result > 0 ? static_cast<uint64_t>(result) : 0;
      if (int fault = injected_fault(&allowed)) {
        result = -fault;
      } else if (result > 0) {
        // An injected short read: pretend fewer bytes arrived; the rest is read again.
        result = static_cast<int>(allowed);
      }
      --in_kernel_;
      Slot& slot = slots_[index];
      if (result == -EINTR || result == -EAGAIN) {
        queue_read(index);  // submitted at the top of the loop
        continue;
      }
      ReadCompletion done;
      done.tag = slot.request.tag;
      done.file = slot.request.file;
      bool finished = false;
      if (result < 0) {
        done.error = -result;
        finished = true;
      } else if (result == 0) {
        done.truncated = slot.done < required_bytes(slot.request);
        finished = true;
      } else {
        slot.done += static_cast<uint64_t>(result);
        finished = slot.done >= slot.request.length;
        if (!finished) {  // short read: ask for the rest (submitted at the top of the loop)
          queue_read(index);
          continue;
        }
      }
      done.bytes = slot.done;
      done.finished = std::chrono::steady_clock::now();
      done.seconds = std::chrono::duration<double>(done.finished - slot.start).count();
      free_slots_.push_back(index);
      --in_flight_;
      fill();
      return done;
    }
  }

  size_t in_flight() const override { return in_flight_; }

 private:
  struct Slot {
    ReadRequest request;
    uint64_t done = 0;
    std::chrono::steady_clock::time_point start;
  };

  // Prepares the read of slot `index` (submitted by the next try_submit).
  void queue_read(unsigned index) {
    Slot& slot = slots_[index];
    // One slot per ring entry, so a free sqe always exists for a slot's (re)submission; a
    // missing one is a broken invariant, reported rather than dereferenced.
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {
      throw Error(ErrorKind::Internal, "", "", "io_uring has no free submission entry");
    }
    uint64_t remaining = slot.request.length - slot.done;
    unsigned size = static_cast<unsigned>(remaining > (1u << 30) ? (1u << 30) : remaining);
    io_uring_prep_read(sqe, slot.request.fd, static_cast<char*>(slot.request.dest) + slot.done,
                       size, slot.request.offset + slot.done);
    io_uring_sqe_set_data64(sqe, index);
    ++prepared_;
  }

  // Hands the prepared entries to the kernel; entries the kernel asks to retry (EAGAIN, EBUSY:
  // resources free up as reads complete) stay prepared for the next call. Any other failure
  // breaks the backend for good: entries left prepared point into buffers of this pass, so no
  // later submit may hand them to the kernel.
  void try_submit() {
    while (prepared_ > 0 && broken_.empty()) {
      int fault = injected_uring_submit_failure();
      int rc = fault ? -fault : io_uring_submit(&ring_);
      if (rc > 0) {
        prepared_ -= static_cast<size_t>(rc);
        in_kernel_ += static_cast<size_t>(rc);
      } else if (rc == -EINTR) {
        continue;
      } else if (rc == -EAGAIN || rc == -EBUSY) {
        return;
      } else {  // 0 submitted with entries prepared would never progress either
        broken_ = std::string("io_uring submit failed: ") + errno_message(rc < 0 ? -rc : EIO);
      }
    }
  }

  // try_submit for a consumer about to wait. Reads already in the kernel are always waited for
  // (their completions returned as usual), so no read can land in memory after its owner gave
  // it up; with none left, a broken backend, or a retried submit with nothing in the kernel
  // after ~1 s, is an Error instead of a wait that never ends.
  void submit_or_throw() {
    for (int attempt = 0;; ++attempt) {
      if (prepared_ == 0 && in_kernel_ == 0 && broken_.empty()) {
        throw Error(ErrorKind::Internal, "", "", "waiting on io_uring with no read queued");
      }
      try_submit();
      if (in_kernel_ > 0) return;
      if (!broken_.empty()) throw Error(ErrorKind::Io, "", "", broken_);
      if (attempt == 1000) {
        broken_ = "io_uring submit failed: the kernel kept refusing with nothing in flight";
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
  }

  // Starts backlog reads in free slots. A failed submit is reported by wait_completion(), so a
  // completion already taken off the ring is never lost to it; throws only Error(Internal), a
  // broken invariant (no submission entry for a free slot).
  void fill() {
    while (!backlog_.empty() && !free_slots_.empty()) {
      unsigned index = free_slots_.front();
      free_slots_.pop_front();
      slots_[index] = Slot{backlog_.front(), 0, std::chrono::steady_clock::now()};
      backlog_.pop_front();
      queue_read(index);
    }
    try_submit();
  }

  unsigned depth_;
  io_uring ring_{};
  std::vector<Slot> slots_;
  std::deque<unsigned> free_slots_;
  std::deque<ReadRequest> backlog_;
  size_t in_flight_ = 0;
  size_t prepared_ = 0;   // entries prepared, not yet accepted by a submit
  size_t in_kernel_ = 0;  // entries submitted whose completion has not been reaped
  std::string broken_;    // why submits stopped for good; empty while they work
};

}  // namespace

std::unique_ptr<ReadBackend> make_uring_backend(unsigned depth) {
  return std::make_unique<UringBackend>(depth);
}
#else
std::unique_ptr<ReadBackend> make_uring_backend(unsigned) {
  throw Error(ErrorKind::Io, "", "", "io_uring support was not built (liburing-dev missing)");
}
#endif

}  // namespace instanttensor::io

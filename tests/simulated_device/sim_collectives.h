// Collectives for the simulated device: a c10d backend ("simccl") that behaves like NCCL towards
// its callers. Each collective is queued on the current stream of the tensors' device and
// returns at once; the stream then stalls until the bytes have been carried between the ranks
// through host memory by another backend (gloo), as an NCCL kernel occupies its stream. The
// device's copy engines move the bytes to and from the host (so the timing model and the delays
// apply); Work::wait() makes the caller's current stream wait, never the host. Test-only.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace simdev {

// One collective in flight: run by the backend's communication thread once the stream that
// queued it has reached it.
struct CollectiveJob;

class CollectiveBackend final : public c10d::Backend {
 public:
  // `host`: a backend over the same ranks for CPU tensors (gloo), which carries the bytes.
  // Any thread; collectives are issued in the order the ranks call them, like NCCL's.
  CollectiveBackend(c10::intrusive_ptr<c10d::Backend> host, int rank, int size);
  ~CollectiveBackend() override;

  const std::string getBackendName() const override { return "simccl"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& options) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& options) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& options) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& options) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& options) override;
  // A barrier through the host backend, in order with the collectives; returns once every rank
  // came (as NCCL's barrier synchronizes its stream).
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& options) override;

  // Collectives issued and not yet carried (tests: nothing left pending after a failure).
  size_t pending() const;

 private:
  // Queues `body` (run on the communication thread once the stream reached it) on this
  // backend's collective stream of `device`, after the work queued so far on the current
  // stream; `outputs` are the Work's result.
  c10::intrusive_ptr<c10d::Work> launch(c10::DeviceIndex device, c10d::OpType type,
                                        std::function<void()> body,
                                        std::vector<at::Tensor> outputs);
  void run_jobs();

  c10::intrusive_ptr<c10d::Backend> host_;
  const c10::StreamId stream_id_;  // this backend's collective stream on each device
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::shared_ptr<CollectiveJob>> jobs_;
  size_t in_flight_ = 0;
  std::exception_ptr failed_;  // the first collective that failed: later ones raise it
  bool stopping_ = false;
  std::thread communicator_;
};

}  // namespace simdev

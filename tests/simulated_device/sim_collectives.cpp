#include "sim_collectives.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <utility>

#include "sim_allocators.h"
#include "sim_runtime.h"

namespace simdev {

struct CollectiveJob {
  std::function<void()> body;
  std::mutex mutex;
  std::condition_variable changed;
  bool reached = false;  // the stream got to the collective
  bool done = false;     // the bytes are in place (or it failed)
  std::exception_ptr error;
};

namespace {

constexpr auto kType = c10::DeviceType::PrivateUse1;

c10::DeviceIndex simccl_device_of(const at::Tensor& t) {
  TORCH_CHECK(t.device().type() == kType, "simccl: tensors must be on the simulated device, got ",
              t.device());
  TORCH_CHECK(t.is_contiguous(), "simccl: tensors must be contiguous");
  return t.device().has_index() ? t.device().index() : current_device();
}

// The host copy of a device tensor's bytes, through the device's copy engine. Communication
// thread, after the stream reached the collective (the bytes are final).
at::Tensor download(const at::Tensor& device_tensor) {
  at::Tensor host = at::empty(device_tensor.sizes(), device_tensor.options().device(at::kCPU));
  const size_t nbytes = device_tensor.nbytes();
  const DeviceRange source = device_range(real(device_tensor.data_ptr()), nbytes);
  engine_move(simccl_device_of(device_tensor), Direction::DeviceToHost, nbytes, [&] {
    touch_live(source, DeviceRange{}, [&] {
      if (moves(nbytes)) std::memcpy(host.data_ptr(), source.host, nbytes);
    });
  });
  return host;
}

void upload(const at::Tensor& host, const at::Tensor& device_tensor) {
  const size_t nbytes = device_tensor.nbytes();
  const DeviceRange target = device_range(real(device_tensor.data_ptr()), nbytes);
  engine_move(simccl_device_of(device_tensor), Direction::HostToDevice, nbytes, [&] {
    touch_live(target, DeviceRange{}, [&] {
      if (moves(nbytes)) std::memcpy(const_cast<void*>(target.host), host.data_ptr(), nbytes);
    });
  });
}

at::Tensor empty_host_like(const at::Tensor& device_tensor) {
  return at::empty(device_tensor.sizes(), device_tensor.options().device(at::kCPU));
}

// What a caller holds: the stream position after the collective. wait() orders the caller's
// current stream after it (NCCL's semantics: the host never blocks).
class CollectiveWork final : public c10d::Work {
 public:
  CollectiveWork(std::shared_ptr<CollectiveJob> job, c10::Stream stream, uint64_t sequence,
                 c10d::OpType type, std::vector<at::Tensor> outputs)
      : c10d::Work(-1, type),
        job_(std::move(job)),
        stream_(stream),
        sequence_(sequence),
        outputs_(std::move(outputs)) {}

  bool isCompleted() override { return stream_of(stream_).passed(sequence_); }
  bool isSuccess() const override {
    std::lock_guard<std::mutex> lock(job_->mutex);
    return job_->done && !job_->error;
  }
  std::exception_ptr exception() const override {
    std::lock_guard<std::mutex> lock(job_->mutex);
    return job_->error;
  }
  bool wait(std::chrono::milliseconds) override {
    synchronize();
    return true;
  }
  void synchronize() override {
    {
      std::lock_guard<std::mutex> lock(job_->mutex);
      if (job_->error) std::rethrow_exception(job_->error);
    }
    c10::Stream current = current_stream(stream_.device_index());
    if (current == stream_) return;  // a stream is ordered with itself
    Stream* after = &stream_of(stream_);
    uint64_t sequence = sequence_;
    stream_of(current).enqueue([after, sequence] { after->wait_for(sequence); });
  }
  std::vector<at::Tensor> result() override { return outputs_; }

 private:
  std::shared_ptr<CollectiveJob> job_;
  c10::Stream stream_;
  uint64_t sequence_;
  std::vector<at::Tensor> outputs_;
};

}  // namespace

CollectiveBackend::CollectiveBackend(c10::intrusive_ptr<c10d::Backend> host, int rank, int size)
    : c10d::Backend(rank, size),
      host_(std::move(host)),
      stream_id_(next_collective_stream()),
      communicator_([this] { run_jobs(); }) {}

CollectiveBackend::~CollectiveBackend() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  communicator_.join();
}

size_t CollectiveBackend::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_flight_;
}

c10::intrusive_ptr<c10d::Work> CollectiveBackend::launch(c10::DeviceIndex device, c10d::OpType type,
                                                         std::function<void()> body,
                                                         std::vector<at::Tensor> outputs) {
  auto job = std::make_shared<CollectiveJob>();
  job->body = std::move(body);
  {
    // Issued in call order: every rank's communication thread then runs them in the same order.
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_) std::rethrow_exception(failed_);
    jobs_.push_back(job);
    in_flight_ += 1;
  }
  changed_.notify_all();
  // NCCL's order: the collective runs on a stream of its own once the caller's stream has run
  // what was queued on it so far; the caller's stream goes on (work queued on it later does
  // not wait for the collective unless the caller waits for the work).
  Stream& caller = stream_of(current_stream(device));
  Stream& own = simdev::stream(device, stream_id_);
  const uint64_t queued = caller.enqueued();
  own.enqueue([&caller, queued] { caller.wait_for(queued); });
  c10::Stream stream = own.handle();
  uint64_t sequence = own.enqueue([job] {
    std::unique_lock<std::mutex> lock(job->mutex);
    job->reached = true;
    job->changed.notify_all();
    job->changed.wait(lock, [&] { return job->done; });
    catch_up_device_clock();
  });
  return c10::make_intrusive<CollectiveWork>(std::move(job), stream, sequence, type,
                                             std::move(outputs));
}

void CollectiveBackend::run_jobs() {
  while (true) {
    std::shared_ptr<CollectiveJob> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and every collective issued has run
      job = jobs_.front();
      jobs_.pop_front();
    }
    {
      std::unique_lock<std::mutex> lock(job->mutex);
      job->changed.wait(lock, [&] { return job->reached; });
    }
    std::exception_ptr error;
    try {
      job->body();
    } catch (...) {
      error = std::current_exception();
    }
    std::function<void()> finished = std::move(job->body);  // its tensors go with it, here
    finished = nullptr;
    {
      // Counted out before the stream moves on: a host that synchronized sees it gone.
      std::lock_guard<std::mutex> lock(mutex_);
      in_flight_ -= 1;
      // Like NCCL's asynchronous errors: the communicator is broken from here on, and every
      // later collective raises when it is issued.
      if (error && !failed_) failed_ = error;
    }
    {
      std::lock_guard<std::mutex> lock(job->mutex);
      job->error = error;
      job->done = true;
    }
    job->changed.notify_all();
  }
}

c10::intrusive_ptr<c10d::Work> CollectiveBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& options) {
  TORCH_CHECK(tensors.size() == 1, "simccl: broadcast takes one tensor");
  at::Tensor tensor = tensors[0];
  const bool root = options.rootRank == getRank();
  auto host = host_;
  return launch(
      simccl_device_of(tensor), c10d::OpType::BROADCAST,
      [host, tensor, options, root] {
        std::vector<at::Tensor> bytes = {root ? download(tensor) : empty_host_like(tensor)};
        host->broadcast(bytes, options)->wait();
        if (!root) upload(bytes[0], tensor);
      },
      {tensor});
}

c10::intrusive_ptr<c10d::Work> CollectiveBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& options) {
  TORCH_CHECK(tensors.size() == 1, "simccl: allreduce takes one tensor");
  at::Tensor tensor = tensors[0];
  auto host = host_;
  return launch(simccl_device_of(tensor), c10d::OpType::ALLREDUCE,
                [host, tensor, options] {
                  std::vector<at::Tensor> bytes = {download(tensor)};
                  host->allreduce(bytes, options)->wait();
                  upload(bytes[0], tensor);
                },
                {tensor});
}

c10::intrusive_ptr<c10d::Work> CollectiveBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& options) {
  TORCH_CHECK(
      inputs.size() == 1 && outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
      "simccl: allgather takes one input and one output per rank");
  at::Tensor input = inputs[0];
  std::vector<at::Tensor> gathered = outputs[0];
  for (const auto& out : gathered) simccl_device_of(out);
  auto host = host_;
  return launch(
      simccl_device_of(input), c10d::OpType::ALLGATHER,
      [host, input, gathered, options] {
        std::vector<at::Tensor> mine = {download(input)};
        std::vector<std::vector<at::Tensor>> all(1);
        for (const auto& out : gathered) all[0].push_back(empty_host_like(out));
        host->allgather(all, mine, options)->wait();
        for (size_t r = 0; r < gathered.size(); ++r) upload(all[0][r], gathered[r]);
      },
      gathered);
}

c10::intrusive_ptr<c10d::Work> CollectiveBackend::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& options) {
  TORCH_CHECK(output.numel() == input.numel() * getSize(),
              "simccl: the output of an all-gather holds world x input elements");
  at::Tensor out = output;
  at::Tensor in = input;
  simccl_device_of(out);
  // The in-place form (the input is this rank's slice of the output, as the loader gathers):
  // only the other ranks' slices come back over the bus, as with NCCL.
  const int rank = getRank();
  const bool in_place = static_cast<const uint8_t*>(in.data_ptr()) ==
                        static_cast<const uint8_t*>(out.data_ptr()) + rank * in.nbytes();
  auto host = host_;
  return launch(simccl_device_of(in), c10d::OpType::_ALLGATHER_BASE,
                [host, out, in, options, rank, in_place] {
                  if (!moves(out.nbytes())) {
                    // Benchmarks (sim_runtime.h): a rendezvous of the ranks, then the copy
                    // engines' time, no bytes. Both directions at once: NCCL's ring over the
                    // host bus sends this rank's slice while it receives the others', in
                    // pipelined chunks, so a gather holds each engine for its own bytes, not
                    // for their sum.
                    host->barrier(c10d::BarrierOptions())->wait();
                    auto sent = std::async(std::launch::async, [&] {
                      engine_time(simccl_device_of(in), Direction::DeviceToHost, in.nbytes());
                    });
                    engine_time(simccl_device_of(out), Direction::HostToDevice,
                                out.nbytes() - (in_place ? in.nbytes() : 0));
                    sent.get();
                    return;
                  }
                  at::Tensor mine = download(in);
                  at::Tensor all = empty_host_like(out);
                  host->_allgather_base(all, mine, options)->wait();
                  if (!in_place) {
                    upload(all, out);
                    return;
                  }
                  const int64_t slice = in.numel();
                  const int64_t ranks = out.numel() / std::max<int64_t>(slice, 1);
                  for (int64_t r = 0; r < ranks && slice > 0; ++r) {
                    if (r != rank)
                      upload(all.narrow(0, r * slice, slice), out.narrow(0, r * slice, slice));
                  }
                },
                {out});
}

c10::intrusive_ptr<c10d::Work> CollectiveBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& options) {
  TORCH_CHECK(!inputs.empty() && outputs.size() == inputs.size(),
              "simccl: as many outputs as inputs, at least one");
  c10::intrusive_ptr<c10d::Work> last;
  for (size_t i = 0; i < inputs.size(); ++i) last = _allgather_base(outputs[i], inputs[i], options);
  return last;  // one stream: the last collective completes after the others
}

c10::intrusive_ptr<c10d::Work> CollectiveBackend::barrier(const c10d::BarrierOptions& options) {
  // On the communication thread like every collective (gloo pairs operations in call order),
  // and the host waits for it, as NCCL's barrier synchronizes its stream.
  auto host = host_;
  auto work = launch(current_device(), c10d::OpType::BARRIER,
                     [host, options] { host->barrier(options)->wait(); }, {});
  work->wait();
  stream_of(current_stream(current_device())).synchronize();
  return work;
}

}  // namespace simdev

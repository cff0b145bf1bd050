#include "helper_thread_group.h"

#include <condition_variable>
#include <map>
#include <mutex>
#include <vector>

namespace instanttensor::testing {

// One rendezvous per collective: each rank leaves its input, the last to arrive publishes them
// all under the collective's number, and every rank copies what it needs from there.
struct ThreadGroupState {
  explicit ThreadGroupState(int world) : world(world), inputs(world) {}

  std::vector<at::Tensor> meet(int /*rank*/, uint64_t number, int slot, const at::Tensor& input) {
    std::unique_lock<std::mutex> lock(mutex);
    inputs[slot] = input.defined() ? input.clone() : input;
    if (++arrived == world) {
      results[number] = inputs;
      arrived = 0;
      inputs.assign(world, at::Tensor());
      changed.notify_all();
    }
    changed.wait(lock, [&] { return results.count(number) > 0; });
    return results[number];
  }

  const int world;
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<at::Tensor> inputs;
  int arrived = 0;
  std::map<uint64_t, std::vector<at::Tensor>> results;
};

namespace {

class DoneWork : public c10d::Work {
 public:
  bool isCompleted() override { return true; }
  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
};

class ThreadBackend : public c10d::Backend {
 public:
  ThreadBackend(int rank, int world, std::shared_ptr<ThreadGroupState> state)
      : c10d::Backend(rank, world), state_(std::move(state)) {}

  const std::string getBackendName() const override { return "threads"; }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    auto all = state_->meet(rank_, next_++, rank_, inputs.at(0));
    for (int r = 0; r < size_; ++r) outputs.at(0).at(r).copy_(all[r]);
    return c10::make_intrusive<DoneWork>();
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    auto all = state_->meet(rank_, next_++, rank_, input);
    auto parts = output.chunk(size_);
    for (int r = 0; r < size_; ++r) parts[r].copy_(all[r]);
    return c10::make_intrusive<DoneWork>();
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& options) override {
    const int root = static_cast<int>(options.rootRank);
    auto all = state_->meet(rank_, next_++, rank_, rank_ == root ? tensors.at(0) : at::Tensor());
    if (rank_ != root) tensors.at(0).copy_(all[root]);
    return c10::make_intrusive<DoneWork>();
  }

 private:
  std::shared_ptr<ThreadGroupState> state_;
  uint64_t next_ = 0;  // this rank's collectives so far: equal on every rank at each call
};

}  // namespace

std::vector<c10::intrusive_ptr<c10d::ProcessGroup>> thread_group(int world) {
  auto state = std::make_shared<ThreadGroupState>(world);
  std::vector<c10::intrusive_ptr<c10d::ProcessGroup>> groups;
  for (int rank = 0; rank < world; ++rank) {
    auto group = c10::make_intrusive<c10d::ProcessGroup>(rank, world);
    auto backend = c10::make_intrusive<ThreadBackend>(rank, world, state);
    group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::CUSTOM, backend);
    group->setDefaultBackend(c10d::ProcessGroup::BackendType::CUSTOM);
    groups.push_back(group);
  }
  return groups;
}

}  // namespace instanttensor::testing

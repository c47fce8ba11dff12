#include "stagehand/trainers/generator.hpp"

#include <caf/all.hpp>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "stagehand/actors/messages.hpp"
#include "stagehand/models/bandit_mlp.hpp"
#include "stagehand/models/bandit_task.hpp"

namespace stagehand {

namespace {

using Policy = std::shared_ptr<const PolicyWeights>;

/// The versions a generator received over a weight-sync channel: a thread waits in receive()
/// for each next version, so that every push finds it waiting, and keeps the newest few.
class ChannelVersions {
 public:
  ChannelVersions(const ModelConfig& model, GeneratorWeights weights)
      : model_(model), weights_(std::move(weights)), thread_([this] { run(); }) {}

  ~ChannelVersions() {
    stop_ = true;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (receiver_) receiver_->stop();
    }
    thread_.join();
  }

  /// Version `version`, waiting at most `timeout` for it.
  Result<Policy> wait_for(std::int64_t version, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto has = [&] { return versions_.count(version) != 0 || newest_ > version || !failed_.is_ok(); };
    if (!cv_.wait_for(lock, timeout, has)) {
      return Status{ErrorCode::timeout, weights_.name + ": version " + std::to_string(version) +
                                            " of the weights did not come within " +
                                            std::to_string(timeout.count()) + " ms" + last_error_text()};
    }
    auto it = versions_.find(version);
    if (it != versions_.end()) return it->second;
    if (!failed_.is_ok()) return failed_;
    return Status{ErrorCode::aborted, weights_.name + ": version " + std::to_string(version) +
                                          " of the weights was passed over (the newest it has is " +
                                          std::to_string(newest_) + ")" + last_error_text()};
  }

 private:
  std::string last_error_text() const { return last_error_.empty() ? "" : "; last: " + last_error_; }

  void fail(Status st) {
    std::lock_guard<std::mutex> lock(mutex_);
    failed_ = st.with_context(weights_.name);
    cv_.notify_all();
  }

  /// Connects in short tries, so that a generator stopped before the trainer ranks' segments
  /// exist or rank 0 listens (a run that failed at its start) ends at once; null when stopped or failed.
  std::shared_ptr<WeightReceiver> connect() {
    const auto deadline = std::chrono::steady_clock::now() + weights_.options.connect_timeout;
    WeightChannelOptions options = weights_.options;
    options.connect_timeout = std::chrono::milliseconds(200);
    for (;;) {
      auto receiver = connect_weight_receiver(weights_.channel, weights_.name, BanditMlp::policy_blocks(model_), options);
      if (stop_) return nullptr;
      if (receiver.is_ok()) {
        std::shared_ptr<WeightReceiver> made(std::move(*receiver));
        std::lock_guard<std::mutex> lock(mutex_);
        receiver_ = made;
        return made;
      }
      if (receiver.status().code() != ErrorCode::timeout || std::chrono::steady_clock::now() >= deadline) {
        fail(receiver.status());
        return nullptr;
      }
    }
  }

  void run() {
    StateDict buffer;
    for (const auto& d : BanditMlp::policy_blocks(model_)) {
      auto t = Tensor::empty(d.dtype, d.local_shape, Device::host());
      if (!t.is_ok()) return fail(t.status());
      buffer.add_full(d.name, std::move(*t));
    }
    std::shared_ptr<WeightReceiver> receiver;
    std::int64_t next = 0;
    while (!stop_) {
      if (!receiver && !(receiver = connect())) return;
      if (stop_) return;
      // A long wait (stop() ends it at once), so that every trainer rank's part of a version is
      // taken in one receive even when the ranks push some time apart.
      auto step = receiver->receive(buffer, next, weights_.options.connect_timeout);
      if (!step.is_ok()) {
        if (step.status().code() == ErrorCode::timeout) continue;  // nothing pushed: no news
        {
          std::lock_guard<std::mutex> lock(mutex_);
          last_error_ = step.status().message();
        }
        if (step.status().code() == ErrorCode::io_error) {
          // A trainer rank's segment is gone or closed (one a crashed run left, replaced when
          // the rank starts): connect again.
          {
            std::lock_guard<std::mutex> lock(mutex_);
            receiver_.reset();
          }
          receiver.reset();
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        continue;
      }
      auto policy = BanditMlp::policy_from(buffer, *step);
      if (!policy.is_ok()) return fail(policy.status());
      std::lock_guard<std::mutex> lock(mutex_);
      versions_[*step] = std::make_shared<const PolicyWeights>(std::move(*policy));
      newest_ = *step;
      while (static_cast<std::int64_t>(versions_.size()) > weights_.keep) versions_.erase(versions_.begin());
      cv_.notify_all();
      next = *step + 1;
    }
  }

  ModelConfig model_;
  GeneratorWeights weights_;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::int64_t, Policy> versions_;
  std::int64_t newest_ = -1;
  Status failed_;
  std::string last_error_;
  std::shared_ptr<WeightReceiver> receiver_;  // for stop() from the destructor
  std::thread thread_;  // last: it starts once the members above exist
};

class Generator : public caf::event_based_actor {
 public:
  Generator(caf::actor_config& cfg, ModelConfig model, std::uint64_t seed, GeneratorWeights weights,
            std::chrono::milliseconds timeout)
      : caf::event_based_actor(cfg),
        model_(model),
        task_(seed, model.context_dim, model.num_arms),
        store_(weights.store),
        timeout_(timeout) {
    if (!store_) channel_ = std::make_unique<ChannelVersions>(model, std::move(weights));
  }

  caf::behavior make_behavior() override {
    return {
        [this](generate_atom, std::int64_t, std::int64_t version, std::int64_t first,
               std::int64_t count) -> caf::result<std::vector<std::int32_t>> {
          // A little less than the trainer's request waits, so that the trainer hears why.
          const auto wait = timeout_ - timeout_ / 10;
          auto weights = store_ ? store_->wait_for(version, wait) : channel_->wait_for(version, wait);
          if (!weights.is_ok()) return to_caf_error(weights.status());
          return generate_actions(task_, **weights, model_.group_size, static_cast<std::uint64_t>(first),
                                  static_cast<std::size_t>(count));
        },
    };
  }

  void on_exit() override { channel_.reset(); }

 private:
  ModelConfig model_;
  BanditTask task_;
  std::shared_ptr<WeightStore> store_;
  std::unique_ptr<ChannelVersions> channel_;
  std::chrono::milliseconds timeout_;
};

}  // namespace

caf::actor spawn_generator(caf::actor_system& system, const ModelConfig& model, std::uint64_t seed,
                           GeneratorWeights weights, std::chrono::milliseconds timeout) {
  return system.spawn<Generator, caf::detached>(model, seed, std::move(weights), timeout);
}

}  // namespace stagehand

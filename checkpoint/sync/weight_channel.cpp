// Picks a weight-sync transport by the channel's name (weight_channel.hpp).
#include "stagehand/checkpoint/sync/weight_channel.hpp"

#include "stagehand/checkpoint/sync/shm_channel.hpp"
#include "stagehand/checkpoint/sync/tcp_channel.hpp"

namespace stagehand {

namespace {
constexpr char kTcp[] = "tcp://";
}

bool is_tcp_channel(const std::string& channel) { return channel.rfind(kTcp, 0) == 0; }

Status serve_late_receivers(WeightPublisher& publisher, std::int64_t step, const StateDict& state, StagingFence& fence,
                            const std::atomic<bool>& stop, const std::function<void(const PushReport&)>& on_report,
                            std::chrono::milliseconds poll) {
  while (!stop.load() && !fence.wait_for_waiter(poll)) {
    if (publisher.late_receivers(step) == 0) continue;
    auto report = publisher.push_late(step, state);
    if (!report.is_ok()) return report.status().with_context("serving step " + std::to_string(step) + " to late receivers");
    if (on_report) on_report(*report);
  }
  return Status::ok();
}

Result<std::unique_ptr<WeightPublisher>> open_weight_publisher(const std::string& channel, int rank, int world,
                                                               std::vector<ShardedTensorDesc> blocks,
                                                               const WeightChannelOptions& options) {
  if (is_tcp_channel(channel)) {
    auto made = TcpWeightPublisher::create(channel.substr(sizeof kTcp - 1), rank, world, std::move(blocks), options);
    if (!made.is_ok()) return made.status();
    return std::unique_ptr<WeightPublisher>(std::move(*made));
  }
  auto made = ShmWeightPublisher::create(channel, rank, world, std::move(blocks), options);
  if (!made.is_ok()) return made.status();
  return std::unique_ptr<WeightPublisher>(std::move(*made));
}

Result<std::unique_ptr<WeightReceiver>> connect_weight_receiver(const std::string& channel, const std::string& name,
                                                                std::vector<ShardedTensorDesc> blocks,
                                                                const WeightChannelOptions& options) {
  if (is_tcp_channel(channel)) {
    auto made = TcpWeightReceiver::connect(channel.substr(sizeof kTcp - 1), name, std::move(blocks), options);
    if (!made.is_ok()) return made.status();
    return std::unique_ptr<WeightReceiver>(std::move(*made));
  }
  auto made = ShmWeightReceiver::connect(channel, name, std::move(blocks), options);
  if (!made.is_ok()) return made.status();
  return std::unique_ptr<WeightReceiver>(std::move(*made));
}

}  // namespace stagehand

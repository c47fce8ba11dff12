#pragma once

// Trainer and inference layouts for the weight-sync tests: each rank's blocks of three tensors,
// filled with values that depend on the tensor, the global element and the step.

#include <algorithm>
#include <chrono>
#include <functional>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "stagehand/checkpoint/sync/weight_channel.hpp"
#include "stagehand/checkpoint/sync/weight_sync.hpp"
#include "stagehand/core/sharded_tensor.hpp"

namespace stagehand::sync_layouts {

/// Rows [begin, end) of `parts` nearly equal parts of `n` (the first parts one longer): uneven
/// splits too.
inline std::pair<std::int64_t, std::int64_t> part_of(std::int64_t n, int parts, int part) {
  const std::int64_t base = n / parts, extra = n % parts;
  const std::int64_t begin = part * base + std::min<std::int64_t>(part, extra);
  return {begin, begin + base + (part < extra ? 1 : 0)};
}

/// The value every layout must hold at a global element: depends on the tensor and the index.
inline float reference(const std::string& name, std::int64_t flat, std::int64_t step = 0) {
  return static_cast<float>(step) * 100000.0f + static_cast<float>(name.size() * 1000 + static_cast<std::size_t>(name[0])) + static_cast<float>(flat) * 0.5f;
}

constexpr std::int64_t kRows = 8, kCols = 6;

/// One rank of a layout of `tp` tensor-parallel ranks times some replicas (rank = replica * tp +
/// tp rank): "qkv" split by rows (column-parallel), "proj" by columns (row-parallel), "norm"
/// whole on every rank. With `fill`, the blocks hold the reference values of `step`; else zeros.
/// `rows` sets the size (the two matrices are rows x 6).
inline StateDict rank_state(int tp, int rank, bool fill, std::int64_t step = 0, std::int64_t rows = kRows) {
  const int t = rank % tp, replica = rank / tp;
  StateDict state;
  auto add = [&](const std::string& name, Shape global, Shape offset, Shape local) {
    Tensor tensor = *Tensor::empty(DType::f32, local, Device::host());
    float* data = tensor.host_data<float>();
    const std::int64_t cols = local.rank() == 2 ? local[1] : 1;
    for (std::int64_t i = 0; i < local.numel(); ++i) {
      std::int64_t flat = 0;
      if (global.rank() == 2) {
        flat = (offset[0] + i / cols) * global[1] + offset[1] + i % cols;
      } else {
        flat = offset[0] + i;
      }
      data[i] = fill ? reference(name, flat, step) : 0.0f;
    }
    state.add(name, std::move(tensor), global, offset, replica);
  };
  auto [r0, r1] = part_of(rows, tp, t);
  add("qkv", Shape{rows, kCols}, Shape{r0, 0}, Shape{r1 - r0, kCols});
  auto [c0, c1] = part_of(kCols, tp, t);
  add("proj", Shape{rows, kCols}, Shape{0, c0}, Shape{rows, c1 - c0});
  // Whole on every rank: a replica of every other rank's (replica id 0 on rank 0 only).
  {
    Tensor tensor = *Tensor::empty(DType::f32, Shape{kCols}, Device::host());
    for (std::int64_t i = 0; i < kCols; ++i) tensor.host_data<float>()[i] = fill ? reference("norm", i, step) : 0.0f;
    state.add("norm", std::move(tensor), Shape{kCols}, Shape{0}, rank == 0 ? 0 : 1);
  }
  return state;
}

inline std::vector<StateDict> layout(int tp, int dp, bool fill, std::int64_t step = 0, std::int64_t rows = kRows) {
  std::vector<StateDict> ranks;
  for (int r = 0; r < tp * dp; ++r) ranks.push_back(rank_state(tp, r, fill, step, rows));
  return ranks;
}

inline std::vector<std::vector<ShardedTensorDesc>> descs(const std::vector<StateDict>& ranks) {
  std::vector<std::vector<ShardedTensorDesc>> out;
  for (const auto& r : ranks) out.push_back(r.descriptors());
  return out;
}

/// "" when every element of `state` holds the reference value of `step`; else the first that
/// does not.
inline std::string first_mismatch(const StateDict& state, std::int64_t step = 0) {
  for (const auto& t : state.tensors) {
    const float* data = static_cast<const float*>(t.tensor.data());
    const auto& d = t.desc;
    const std::int64_t cols = d.local_shape.rank() == 2 ? d.local_shape[1] : 1;
    for (std::int64_t i = 0; i < d.local_shape.numel(); ++i) {
      const std::int64_t flat = d.global_shape.rank() == 2
                                    ? (d.global_offset[0] + i / cols) * d.global_shape[1] + d.global_offset[1] + i % cols
                                    : d.global_offset[0] + i;
      if (data[i] != reference(d.name, flat, step)) {
        return "tensor " + d.name + " element " + std::to_string(i) + ": " + std::to_string(data[i]) +
               " != " + std::to_string(reference(d.name, flat, step));
      }
    }
  }
  return "";
}

/// Every element of every receiver block equals the reference of `step`.
inline void check_exact(const std::vector<StateDict>& receivers, std::int64_t step = 0) {
  for (std::size_t q = 0; q < receivers.size(); ++q) {
    const std::string wrong = first_mismatch(receivers[q], step);
    if (!wrong.empty()) BOOST_FAIL("receiver " << q << " " << wrong);
  }
}

/// Trainer rank `rank` of `senders`: pushes each of `steps` until every receiver it serves took
/// it (receivers may not all be waiting yet when a push begins), then keeps its segment until
/// `done` (a shm receiver maps every rank's segment, also those that send it nothing). "" or why
/// it failed.
/// `place` puts each step's state where it is pushed from (default: host memory, as made).
inline std::string run_publisher(const std::string& name, int rank, std::vector<StateDict>& senders,
                          const std::vector<StateDict>& receivers, const std::vector<std::int64_t>& steps, int tp,
                          const WeightChannelOptions& options, std::shared_future<void> done,
                          const std::function<StateDict(StateDict)>& place = {}) {
  auto publisher = open_weight_publisher(name, rank, static_cast<int>(senders.size()),
                                         senders[static_cast<std::size_t>(rank)].descriptors(), options);
  if (!publisher.is_ok()) return publisher.status().to_string();
  auto plan = plan_weight_sync(descs(senders), descs(receivers));
  if (!plan.is_ok()) return plan.status().to_string();
  std::set<int> served;
  for (const auto& t : plan->transfers) {
    if (t.sender == rank) served.insert(t.receiver);
  }
  for (std::int64_t step : steps) {
    StateDict state = place ? place(rank_state(tp, rank, true, step)) : rank_state(tp, rank, true, step);
    std::set<std::string> got;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (got.size() < served.size()) {
      if (std::chrono::steady_clock::now() > deadline) return "rank " + std::to_string(rank) + ": receivers never came";
      auto report = (*publisher)->push(step, state);
      if (!report.is_ok()) return report.status().to_string();
      if (!report->dropped.empty()) return "dropped: " + report->dropped.front();
      got.insert(report->delivered.begin(), report->delivered.end());
      if (got.size() < served.size()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  done.wait();
  return "";
}

}  // namespace stagehand::sync_layouts

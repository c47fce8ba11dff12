#pragma once

// The state of one rank of an SPMD job as an outside trainer holds it (tensor parallel x data
// parallel): a column-split weight replicated over the data-parallel ranks, fp32 Adam moments
// sharded over every rank (each data-parallel rank holds rows of its tensor-parallel block), a
// bias replicated on every rank, a scheduler object shared by all and an RNG state per rank.
// Values are a function of the global index and the step, so any layout can check any load.

#include <cstdint>
#include <string>
#include <vector>

#include "stagehand/core/sharded_tensor.hpp"

namespace stagehand::test {

struct SpmdLayout {
  int tp = 2;
  int dp = 2;
  int world() const { return tp * dp; }
};

inline constexpr std::int64_t kRows = 256;
inline constexpr std::int64_t kCols = 512;

inline float weight_value(std::int64_t step, std::int64_t i, std::int64_t j) {
  return static_cast<float>(step * 1000 + (i * kCols + j) % 100000) * 0.5f;
}
inline float moment_value(std::int64_t step, std::int64_t i, std::int64_t j) { return -weight_value(step, i, j) - 1.0f; }
inline float bias_value(std::int64_t step, std::int64_t j) { return static_cast<float>(step) + static_cast<float>(j) * 0.25f; }
inline std::string scheduler_object(std::int64_t step) {
  return "{\"last_step\": " + std::to_string(step) + ", \"lr\": 0.0003}";
}
inline std::string rng_object(int rank, std::int64_t step) {
  return "{\"seed\": " + std::to_string(rank * 7919 + step) + "}";
}

/// One rank's buffers (the trainer's own memory) and the StateDict that views them.
struct SpmdRank {
  int rank = 0;
  SpmdLayout layout;
  std::vector<float> weight, moment, bias;
  StateDict state;

  int tp_rank() const { return rank % layout.tp; }
  int dp_rank() const { return rank / layout.tp; }
  std::int64_t cols() const { return kCols / layout.tp; }
  std::int64_t moment_rows() const { return kRows / layout.dp; }

  /// Rank `rank` of `layout`, filled with the values of `step` (or zeros, for loading into).
  SpmdRank(int r, SpmdLayout l, std::int64_t step, bool zeros = false) : rank(r), layout(l) {
    weight.assign(static_cast<std::size_t>(kRows * cols()), 0.0f);
    moment.assign(static_cast<std::size_t>(moment_rows() * cols()), 0.0f);
    bias.assign(static_cast<std::size_t>(kCols), 0.0f);
    if (!zeros) fill(step);
    const std::int64_t col0 = cols() * tp_rank();
    state.add("model.w", *Tensor::from_blob(weight.data(), DType::f32, Shape{kRows, cols()}, Device::host()),
              Shape{kRows, kCols}, Shape{0, col0}, dp_rank());
    state.add("optim.exp_avg.model.w",
              *Tensor::from_blob(moment.data(), DType::f32, Shape{moment_rows(), cols()}, Device::host()),
              Shape{kRows, kCols}, Shape{moment_rows() * dp_rank(), col0});
    state.add_full("model.bias", *Tensor::from_blob(bias.data(), DType::f32, Shape{kCols}, Device::host()), rank);
    state.objects["scheduler"] = zeros ? "null" : scheduler_object(step);
    state.objects["rng.rank" + std::to_string(rank)] = zeros ? "null" : rng_object(rank, step);
  }
  SpmdRank(const SpmdRank&) = delete;
  SpmdRank& operator=(const SpmdRank&) = delete;

  void fill(std::int64_t step) {
    const std::int64_t col0 = cols() * tp_rank();
    for (std::int64_t i = 0; i < kRows; ++i) {
      for (std::int64_t j = 0; j < cols(); ++j) weight[static_cast<std::size_t>(i * cols() + j)] = weight_value(step, i, col0 + j);
    }
    const std::int64_t row0 = moment_rows() * dp_rank();
    for (std::int64_t i = 0; i < moment_rows(); ++i) {
      for (std::int64_t j = 0; j < cols(); ++j) {
        moment[static_cast<std::size_t>(i * cols() + j)] = moment_value(step, row0 + i, col0 + j);
      }
    }
    for (std::int64_t j = 0; j < kCols; ++j) bias[static_cast<std::size_t>(j)] = bias_value(step, j);
  }

  /// "" when every value is that of `step`; else the first that is not.
  std::string check(std::int64_t step, const StateDict& loaded) const {
    const std::int64_t col0 = cols() * tp_rank();
    for (std::int64_t i = 0; i < kRows; ++i) {
      for (std::int64_t j = 0; j < cols(); ++j) {
        if (weight[static_cast<std::size_t>(i * cols() + j)] != weight_value(step, i, col0 + j)) {
          return "model.w[" + std::to_string(i) + "," + std::to_string(col0 + j) + "] differs";
        }
      }
    }
    const std::int64_t row0 = moment_rows() * dp_rank();
    for (std::int64_t i = 0; i < moment_rows(); ++i) {
      for (std::int64_t j = 0; j < cols(); ++j) {
        if (moment[static_cast<std::size_t>(i * cols() + j)] != moment_value(step, row0 + i, col0 + j)) {
          return "optim.exp_avg.model.w[" + std::to_string(row0 + i) + "," + std::to_string(col0 + j) + "] differs";
        }
      }
    }
    for (std::int64_t j = 0; j < kCols; ++j) {
      if (bias[static_cast<std::size_t>(j)] != bias_value(step, j)) return "model.bias[" + std::to_string(j) + "] differs";
    }
    auto object = [&](const std::string& name) {
      auto it = loaded.objects.find(name);
      return it == loaded.objects.end() ? std::string("(missing)") : it->second;
    };
    if (object("scheduler") != scheduler_object(step)) return "scheduler is " + object("scheduler");
    const std::string rng = "rng.rank" + std::to_string(rank);
    if (object(rng) != rng_object(rank, step)) return rng + " is " + object(rng);
    return "";
  }
};

}  // namespace stagehand::test

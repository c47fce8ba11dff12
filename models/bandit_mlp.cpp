#include "stagehand/models/bandit_mlp.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "stagehand/models/bandit_limits.hpp"
#include "stagehand/models/bandit_task.hpp"

namespace stagehand {

namespace {

/// The model weights' names, in params_' order (fc1 weight and bias, fc2 weight and bias).
constexpr const char* kWeightNames[4] = {"model.fc1.weight", "model.fc1.bias", "model.fc2.weight", "model.fc2.bias"};

std::uint16_t to_bf16(float f) {
  std::uint32_t x = 0;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffU) > 0x7f800000U) return 0x7fc0;
  x += 0x7fffU + ((x >> 16) & 1U);
  return static_cast<std::uint16_t>(x >> 16);
}

float from_bf16(std::uint16_t h) {
  std::uint32_t x = static_cast<std::uint32_t>(h) << 16;
  float f = 0;
  std::memcpy(&f, &x, 4);
  return f;
}

float round_bf16(float f) { return from_bf16(to_bf16(f)); }

/// The rows [lo, hi) of a local block of `rows` rows whose optimizer state data-parallel rank
/// `d` of `dp` holds.
std::pair<std::int64_t, std::int64_t> optimizer_rows(std::int64_t rows, int d, int dp) {
  return {rows * d / dp, rows * (d + 1) / dp};
}

}  // namespace

struct BanditMlp::Param {
  std::string name;
  /// Split across tensor-parallel ranks (else replicated there).
  bool tensor_split = true;
  Shape global_shape;
  Shape global_offset;
  Shape local_shape;
  /// Maps a local element index to its global one, for seeded initialization.
  std::function<std::uint64_t(std::size_t)> global_index;
  double init_scale = 0;
  std::size_t n = 0;
  /// This data-parallel rank's slice of the optimizer state.
  std::size_t lo = 0;
  std::size_t hi = 0;
  Tensor weight;  // bf16 model weights, local shape
  Tensor main;    // f32 [1, hi - lo]
  Tensor exp_avg;
  Tensor exp_avg_sq;
  std::vector<float> value;  // weight as f32
  std::vector<float> grad;
};

struct BanditMlp::Activations {
  std::vector<float> hidden_pre;  // [n, hidden_local]
  std::vector<float> hidden;      // relu
  std::vector<float> logits;      // [n, num_arms]
};

Result<std::unique_ptr<BanditMlp>> BanditMlp::create(const ModelConfig& config, std::uint64_t seed,
                                                     const ParallelLayout& layout, int rank, RankGroups groups,
                                                     std::shared_ptr<WeightStore> weights) {
  SH_RETURN_IF_ERROR(check_bandit_layout(config, layout));
  if (rank < 0 || rank >= layout.world_size() || !groups.tensor || !groups.data) {
    return Status{ErrorCode::invalid_argument, "rank " + std::to_string(rank) + " is outside the world"};
  }
  std::unique_ptr<BanditMlp> model(new BanditMlp(config, seed, layout, rank, std::move(groups)));
  model->weights_ = std::move(weights);
  SH_ASSIGN_OR_RETURN(model->gemm_, Gemm::create(default_device(rank)));
  SH_RETURN_IF_ERROR(model->build_state());
  return model;
}

BanditMlp::BanditMlp(const ModelConfig& config, std::uint64_t seed, const ParallelLayout& layout, int rank,
                     RankGroups groups)
    : config_(config),
      seed_(seed),
      layout_(layout),
      rank_(rank),
      tp_(layout.tensor_index(rank)),
      dp_(layout.data_index(rank)),
      groups_(std::move(groups)),
      hidden_local_(config.hidden / layout.tensor_parallel),
      task_(seed, config.context_dim, config.num_arms) {}

BanditMlp::~BanditMlp() = default;

Status BanditMlp::build_state() {
  const std::int64_t D = config_.context_dim;
  const std::int64_t K = config_.num_arms;
  const std::int64_t H = config_.hidden;
  const std::int64_t Hl = hidden_local_;
  const std::int64_t t = tp_;
  auto add = [&](std::string name, bool split, Shape global, Shape offset, Shape local, double scale,
                 std::function<std::uint64_t(std::size_t)> index) {
    auto p = std::make_unique<Param>();
    p->name = std::move(name);
    p->tensor_split = split;
    p->global_shape = global;
    p->global_offset = offset;
    p->local_shape = local;
    p->init_scale = scale;
    p->global_index = std::move(index);
    params_.push_back(std::move(p));
  };
  add(kWeightNames[0], true, Shape{H, D}, Shape{t * Hl, 0}, Shape{Hl, D}, 1.0 / std::sqrt(double(D)),
      [=](std::size_t i) { return static_cast<std::uint64_t>((t * Hl + std::int64_t(i) / D) * D + std::int64_t(i) % D); });
  add(kWeightNames[1], true, Shape{H}, Shape{t * Hl}, Shape{Hl}, 0.0,
      [=](std::size_t i) { return static_cast<std::uint64_t>(t * Hl) + i; });
  add(kWeightNames[2], true, Shape{K, H}, Shape{0, t * Hl}, Shape{K, Hl}, 1.0 / std::sqrt(double(H)),
      [=](std::size_t i) { return static_cast<std::uint64_t>((std::int64_t(i) / Hl) * H + t * Hl + std::int64_t(i) % Hl); });
  add(kWeightNames[3], false, Shape{K}, Shape{0}, Shape{K}, 0.0, [](std::size_t i) { return i; });

  state_ = std::make_shared<StateDict>();
  const int dp_size = layout_.data_parallel;
  // Host memory this rank holds for the state: per element bf16 weights, fp32 values, gradients
  // and (while filling) fp32 main weights; per element of its optimizer slice fp32 main weights
  // and two moments.
  std::uint64_t state_bytes = 0;
  for (const auto& p : params_) {
    p->n = static_cast<std::size_t>(p->local_shape.numel());
    // This data-parallel rank's slice of the optimizer state: whole rows of the local block, so
    // that it is a block of the parameter's global shape whatever the layout.
    const auto [row_lo, row_hi] = optimizer_rows(p->local_shape[0], dp_, dp_size);
    const auto cols = static_cast<std::size_t>(p->local_shape.numel() / p->local_shape[0]);
    p->lo = static_cast<std::size_t>(row_lo) * cols;
    p->hi = static_cast<std::size_t>(row_hi) * cols;
    state_bytes += p->n * (2 + 4 + 4 + 4) + (p->hi - p->lo) * 12;
  }
  // The tensors and vectors of every parameter; a vector that cannot grow throws bad_alloc.
  auto allocate = [&]() -> Status {
    for (std::size_t pi = 0; pi < params_.size(); ++pi) {
      Param& p = *params_[pi];
      const auto cols = static_cast<std::size_t>(p.local_shape.numel() / p.local_shape[0]);
      const auto row_lo = static_cast<std::int64_t>(p.lo / cols);
      const auto row_hi = static_cast<std::int64_t>(p.hi / cols);
      p.value.resize(p.n);
      p.grad.resize(p.n);
      SH_ASSIGN_OR_RETURN(p.weight, Tensor::empty(DType::bf16, p.local_shape, Device::host()));
      auto* w = p.weight.host_data<std::uint16_t>();
      std::vector<float> main_full(p.n);
      for (std::size_t i = 0; i < p.n; ++i) {
        main_full[i] = static_cast<float>(p.init_scale * gaussian(seed_, kInitStream + pi * 16, p.global_index(i)));
        w[i] = to_bf16(main_full[i]);
        p.value[i] = from_bf16(w[i]);
      }
      Shape slice = p.local_shape;
      slice[0] = row_hi - row_lo;
      SH_ASSIGN_OR_RETURN(p.main, Tensor::empty(DType::f32, slice, Device::host()));
      SH_ASSIGN_OR_RETURN(p.exp_avg, Tensor::empty(DType::f32, slice, Device::host()));
      SH_ASSIGN_OR_RETURN(p.exp_avg_sq, Tensor::empty(DType::f32, slice, Device::host()));
      std::copy(main_full.begin() + static_cast<std::ptrdiff_t>(p.lo), main_full.begin() + static_cast<std::ptrdiff_t>(p.hi),
                p.main.host_data<float>());
      std::fill_n(p.exp_avg.host_data<float>(), p.hi - p.lo, 0.0f);
      std::fill_n(p.exp_avg_sq.host_data<float>(), p.hi - p.lo, 0.0f);

      // Model weights: replicas on data-parallel ranks (and tensor-parallel ranks when not split),
      // each with replica id 0: the save's global plan has one of them write it, balancing what
      // every rank writes.
      state_->add(p.name, p.weight, p.global_shape, p.global_offset);
      // Optimizer state: the parameter's global shape, each rank its rows of its block, so that
      // the checkpoint does not depend on the tensor- or data-parallel size.
      Shape opt_offset = p.global_offset;
      opt_offset[0] += row_lo;
      for (auto& [name, tensor] : {std::pair{"optimizer.main." + p.name, p.main},
                                   std::pair{"optimizer.exp_avg." + p.name, p.exp_avg},
                                   std::pair{"optimizer.exp_avg_sq." + p.name, p.exp_avg_sq}}) {
        state_->add(name, tensor, p.global_shape, opt_offset);
      }
    }
    return Status::ok();
  };
  Status allocated = [&]() -> Status {
    try {
      return allocate();
    } catch (const std::bad_alloc& e) {
      return {ErrorCode::no_space, e.what()};
    }
  }();
  if (allocated.code() == ErrorCode::no_space) {
    return {ErrorCode::no_space,
            "the model's state does not fit in host memory: " + std::to_string(state_bytes) +
                " bytes on this rank for model.hidden x model.context_dim = " + std::to_string(H) + " x " +
                std::to_string(D) + " (model.fc1.weight, split over parallel.tensor_parallel " +
                std::to_string(layout_.tensor_parallel) + "); make model.hidden or model.context_dim smaller (" +
                allocated.message() + ")"};
  }
  SH_RETURN_IF_ERROR(allocated);
  refresh_objects();
  return Status::ok();
}

void BanditMlp::refresh_objects() {
  state_->objects["scheduler"] = nlohmann::json{{"step", optimizer_step_}}.dump();
  state_->objects["rng.rank" + std::to_string(rank_)] =
      nlohmann::json{{"kind", "counter"}, {"seed", seed_}, {"position", optimizer_step_}}.dump();
}

LoadOptions BanditMlp::load_selection(const LoadScope& scope) {
  LoadOptions selection = load_selection_by_name(*state_, scope);
  if (!scope.optimizer) {
    // The optimizer restarts from the loaded weights: its fp32 main weights are filled from the
    // saved weights themselves (converted), so that weights saved in fp32 (a Hugging Face
    // export with --dtype fp32) come back bit for bit.
    for (const auto& p : params_) {
      selection.skip.erase("optimizer.main." + p->name);
      selection.sources["optimizer.main." + p->name] = p->name;
    }
  }
  return selection;
}

Status BanditMlp::on_loaded(const LoadScope& scope, const LoadReport& report) {
  if (scope.optimizer) {
    // The objects come from a file: check their types, since a wrong one would throw.
    auto scheduler = nlohmann::json::parse(state_->objects["scheduler"], nullptr, false);
    if (scheduler.is_discarded() || !scheduler.is_object() || !scheduler.contains("step") ||
        !scheduler["step"].is_number_integer()) {
      return {ErrorCode::corruption,
              "the checkpoint's 'scheduler' object (policy/metadata.json): field 'step' is missing or not an integer"};
    }
    optimizer_step_ = scheduler["step"].get<std::int64_t>();
  } else {
    // A fresh optimizer: no moments, and its bias correction starts over.
    optimizer_step_ = 0;
    for (auto& p : params_) {
      std::fill_n(p->exp_avg.host_data<float>(), p->hi - p->lo, 0.0f);
      std::fill_n(p->exp_avg_sq.host_data<float>(), p->hi - p->lo, 0.0f);
    }
  }
  // The RNG: a rank takes its own saved position; it re-derives it from the seed and the step
  // (refresh_objects below) when the load skipped it or the checkpoint has none for this rank
  // (one saved by fewer ranks).
  const std::string rng_name = "rng.rank" + std::to_string(rank_);
  const bool rng_missing =
      std::find(report.missing_objects.begin(), report.missing_objects.end(), rng_name) != report.missing_objects.end();
  if (scope.rng && !rng_missing) {
    auto rng = nlohmann::json::parse(state_->objects[rng_name], nullptr, false);
    if (rng.is_discarded() || !rng.is_object() || !rng.contains("seed") || !rng["seed"].is_number_unsigned()) {
      return {ErrorCode::corruption,
              "the checkpoint's '" + rng_name +
                  "' object (policy/metadata.json): field 'seed' is missing or not a non-negative integer"};
    }
    if (rng["seed"].get<std::uint64_t>() != seed_) {
      return {ErrorCode::invalid_argument, "the checkpoint's RNG of rank " + std::to_string(rank_) +
                                               " has another seed than trainer.seed"};
    }
  }
  for (auto& p : params_) {
    const auto* w = p->weight.host_data<std::uint16_t>();
    for (std::size_t i = 0; i < p->n; ++i) p->value[i] = from_bf16(w[i]);
  }
  refresh_objects();
  return Status::ok();
}

Status BanditMlp::forward(const std::vector<float>& x, std::size_t n, Activations& a) {
  const int D = static_cast<int>(config_.context_dim);
  const int K = static_cast<int>(config_.num_arms);
  const int Hl = static_cast<int>(hidden_local_);
  const int N = static_cast<int>(n);
  const auto& w1 = params_[0]->value;
  const auto& b1 = params_[1]->value;
  const auto& w2 = params_[2]->value;
  const auto& b2 = params_[3]->value;
  a.hidden_pre.assign(n * static_cast<std::size_t>(Hl), 0.0f);
  SH_RETURN_IF_ERROR(gemm_->multiply(false, true, N, Hl, D, x.data(), D, w1.data(), D, a.hidden_pre.data(), Hl));
  a.hidden.resize(a.hidden_pre.size());
  for (std::size_t i = 0; i < n; ++i) {
    for (int h = 0; h < Hl; ++h) {
      float& v = a.hidden_pre[i * static_cast<std::size_t>(Hl) + static_cast<std::size_t>(h)];
      v += b1[static_cast<std::size_t>(h)];
      a.hidden[i * static_cast<std::size_t>(Hl) + static_cast<std::size_t>(h)] = v > 0 ? v : 0;
    }
  }
  a.logits.assign(n * static_cast<std::size_t>(K), 0.0f);
  SH_RETURN_IF_ERROR(gemm_->multiply(false, true, N, K, Hl, a.hidden.data(), Hl, w2.data(), Hl, a.logits.data(), K));
  SH_RETURN_IF_ERROR(groups_.tensor->all_reduce_sum(tp_, a.logits.data(), a.logits.size()));
  for (std::size_t i = 0; i < n; ++i) {
    for (int k = 0; k < K; ++k) a.logits[i * static_cast<std::size_t>(K) + static_cast<std::size_t>(k)] += b2[static_cast<std::size_t>(k)];
  }
  return Status::ok();
}

Status BanditMlp::backward(const std::vector<float>& x, std::size_t n, const Activations& a,
                           const std::vector<float>& dlogits) {
  const int D = static_cast<int>(config_.context_dim);
  const int K = static_cast<int>(config_.num_arms);
  const int Hl = static_cast<int>(hidden_local_);
  const int N = static_cast<int>(n);
  Param& w1 = *params_[0];
  Param& b1 = *params_[1];
  Param& w2 = *params_[2];
  Param& b2 = *params_[3];
  SH_RETURN_IF_ERROR(gemm_->multiply(true, false, K, Hl, N, dlogits.data(), K, a.hidden.data(), Hl, w2.grad.data(), Hl));
  std::fill(b2.grad.begin(), b2.grad.end(), 0.0f);
  for (std::size_t i = 0; i < n; ++i) {
    for (int k = 0; k < K; ++k) b2.grad[static_cast<std::size_t>(k)] += dlogits[i * static_cast<std::size_t>(K) + static_cast<std::size_t>(k)];
  }
  std::vector<float> dhidden(n * static_cast<std::size_t>(Hl));
  SH_RETURN_IF_ERROR(gemm_->multiply(false, false, N, Hl, K, dlogits.data(), K, w2.value.data(), Hl, dhidden.data(), Hl));
  std::fill(b1.grad.begin(), b1.grad.end(), 0.0f);
  for (std::size_t i = 0; i < dhidden.size(); ++i) {
    if (a.hidden_pre[i] <= 0) dhidden[i] = 0;
    b1.grad[i % static_cast<std::size_t>(Hl)] += dhidden[i];
  }
  return gemm_->multiply(true, false, Hl, D, N, dhidden.data(), Hl, x.data(), D, w1.grad.data(), D);
}

Status BanditMlp::adam_update() {
  constexpr double kBeta1 = 0.9;
  constexpr double kBeta2 = 0.999;
  constexpr double kEps = 1e-8;
  ++optimizer_step_;
  const double correction1 = 1.0 - std::pow(kBeta1, double(optimizer_step_));
  const double correction2 = 1.0 - std::pow(kBeta2, double(optimizer_step_));
  for (auto& p : params_) {
    // Gradients summed over data-parallel ranks (each already divided by the global batch).
    SH_RETURN_IF_ERROR(groups_.data->all_reduce_sum(dp_, p->grad.data(), p->n));
    float* main = p->main.host_data<float>();
    float* m = p->exp_avg.host_data<float>();
    float* v = p->exp_avg_sq.host_data<float>();
    for (std::size_t i = p->lo; i < p->hi; ++i) {
      const std::size_t s = i - p->lo;
      const double g = p->grad[i];
      m[s] = static_cast<float>(kBeta1 * m[s] + (1 - kBeta1) * g);
      v[s] = static_cast<float>(kBeta2 * v[s] + (1 - kBeta2) * g * g);
      const double update = config_.learning_rate * (m[s] / correction1) / (std::sqrt(v[s] / correction2) + kEps);
      main[s] = static_cast<float>(main[s] - update);
      p->value[i] = round_bf16(main[s]);
    }
    SH_RETURN_IF_ERROR(groups_.data->all_gather(dp_, p->value.data(), p->n, p->lo, p->hi - p->lo));
    auto* w = p->weight.host_data<std::uint16_t>();
    for (std::size_t i = 0; i < p->n; ++i) w[i] = to_bf16(p->value[i]);
  }
  refresh_objects();
  return Status::ok();
}

Result<StepMetrics> BanditMlp::train_step(std::int64_t step, Objective objective,
                                          const std::vector<std::int32_t>& behaviour_actions) {
  const auto K = static_cast<std::size_t>(config_.num_arms);
  const auto D = static_cast<std::size_t>(config_.context_dim);
  const auto global_batch = static_cast<std::size_t>(config_.batch_size);
  const std::size_t n = global_batch / static_cast<std::size_t>(layout_.data_parallel);
  const std::uint64_t first = static_cast<std::uint64_t>(step) * global_batch + static_cast<std::uint64_t>(dp_) * n;
  const auto G = static_cast<std::size_t>(config_.group_size);
  if (!behaviour_actions.empty() && behaviour_actions.size() != global_batch * G) {
    return Status{ErrorCode::invalid_argument, "step " + std::to_string(step) + " got " +
                                                   std::to_string(behaviour_actions.size()) + " actions for " +
                                                   std::to_string(global_batch * G) + " samples"};
  }
  std::vector<float> x = task_.contexts(first, n);
  Activations a;
  SH_RETURN_IF_ERROR(forward(x, n, a));

  std::vector<float> dlogits(n * K, 0.0f);
  double sums[2] = {0, 0};  // reward, loss
  std::vector<double> p;
  for (std::size_t i = 0; i < n; ++i) {
    softmax_row(&a.logits[i * K], K, p);
    const int target = task_.best_arm(&x[i * D]);
    if (objective == Objective::sft) {
      sums[1] += -std::log(std::max(p[static_cast<std::size_t>(target)], 1e-30));
      for (std::size_t k = 0; k < K; ++k) {
        dlogits[i * K + k] = static_cast<float>((p[k] - (int(k) == target ? 1.0 : 0.0)) / double(global_batch));
      }
      continue;
    }
    // GRPO: a group of sampled actions (here, or by a generator), rewards normalized in the group.
    std::vector<std::size_t> actions(G);
    std::vector<double> rewards(G);
    double mean = 0;
    for (std::size_t j = 0; j < G; ++j) {
      const std::size_t global_i = static_cast<std::size_t>(dp_) * n + i;
      std::size_t action = behaviour_actions.empty()
                                ? task_.sample_action(p, first + i, j, G)
                                : static_cast<std::size_t>(behaviour_actions[global_i * G + j]) % K;
      actions[j] = action;
      rewards[j] = int(action) == target ? 1.0 : 0.0;
      mean += rewards[j] / double(G);
    }
    double var = 0;
    for (double r : rewards) var += (r - mean) * (r - mean) / double(G);
    const double stddev = std::sqrt(var);
    const double scale = 1.0 / double(global_batch * G);
    for (std::size_t j = 0; j < G; ++j) {
      sums[0] += rewards[j] / double(G);
      const double advantage = stddev > 0 ? (rewards[j] - mean) / (stddev + 1e-6) : 0.0;
      sums[1] += -advantage * std::log(std::max(p[actions[j]], 1e-30)) / double(G);
      for (std::size_t k = 0; k < K; ++k) {
        dlogits[i * K + k] += static_cast<float>(-advantage * scale * ((k == actions[j] ? 1.0 : 0.0) - p[k]));
      }
    }
  }
  SH_RETURN_IF_ERROR(backward(x, n, a, dlogits));
  // The first write to the state of this step: a save may still be staging from it until here.
  const double fence_wait_s = fence();
  SH_RETURN_IF_ERROR(adam_update());
  float totals[2] = {static_cast<float>(sums[0]), static_cast<float>(sums[1])};
  SH_RETURN_IF_ERROR(groups_.data->all_reduce_sum(dp_, totals, 2));
  return StepMetrics{totals[0] / double(global_batch), totals[1] / double(global_batch), fence_wait_s};
}

std::vector<ShardedTensorDesc> BanditMlp::policy_blocks(const ModelConfig& config) {
  const std::int64_t D = config.context_dim, K = config.num_arms, H = config.hidden;
  auto full = [](std::string name, Shape shape) {
    ShardedTensorDesc d;
    d.name = std::move(name);
    d.dtype = DType::bf16;
    d.global_shape = shape;
    d.global_offset = Shape::zeros(shape.rank());
    d.local_shape = shape;
    return d;
  };
  return {full(kWeightNames[0], Shape{H, D}), full(kWeightNames[1], Shape{H}), full(kWeightNames[2], Shape{K, H}),
          full(kWeightNames[3], Shape{K})};
}

Result<PolicyWeights> BanditMlp::policy_from(const StateDict& received, std::int64_t version) {
  PolicyWeights w;
  w.version = version;
  std::vector<float>* fields[] = {&w.fc1_weight, &w.fc1_bias, &w.fc2_weight, &w.fc2_bias};
  for (int i = 0; i < 4; ++i) {
    const ShardedTensor* found = nullptr;
    for (const auto& t : received.tensors) {
      if (t.desc.name == kWeightNames[i]) found = &t;
    }
    if (found == nullptr || found->tensor.dtype() != DType::bf16 || found->tensor.device().is_cuda()) {
      return Status{ErrorCode::invalid_argument,
                    std::string("the received policy has no bf16 host tensor '") + kWeightNames[i] + "'"};
    }
    const auto* src = static_cast<const std::uint16_t*>(found->tensor.data());
    fields[i]->resize(static_cast<std::size_t>(found->tensor.numel()));
    for (std::size_t k = 0; k < fields[i]->size(); ++k) (*fields[i])[k] = from_bf16(src[k]);
  }
  return w;
}

Status BanditMlp::export_weights(std::int64_t version) {
  if (!weights_ || dp_ != 0) return Status::ok();
  const auto D = static_cast<std::size_t>(config_.context_dim);
  const auto K = static_cast<std::size_t>(config_.num_arms);
  const auto H = static_cast<std::size_t>(config_.hidden);
  const auto Hl = static_cast<std::size_t>(hidden_local_);
  const std::size_t h0 = static_cast<std::size_t>(tp_) * Hl;
  return weights_->publish_shard(version, [&](PolicyWeights& w) {
    std::copy(params_[0]->value.begin(), params_[0]->value.end(), w.fc1_weight.begin() + static_cast<std::ptrdiff_t>(h0 * D));
    std::copy(params_[1]->value.begin(), params_[1]->value.end(), w.fc1_bias.begin() + static_cast<std::ptrdiff_t>(h0));
    for (std::size_t k = 0; k < K; ++k) {
      std::copy_n(params_[2]->value.begin() + static_cast<std::ptrdiff_t>(k * Hl), Hl,
                  w.fc2_weight.begin() + static_cast<std::ptrdiff_t>(k * H + h0));
    }
    if (tp_ == 0) std::copy(params_[3]->value.begin(), params_[3]->value.end(), w.fc2_bias.begin());
  });
}

Result<double> BanditMlp::evaluate() {
  const auto K = static_cast<std::size_t>(config_.num_arms);
  const auto D = static_cast<std::size_t>(config_.context_dim);
  const auto total = static_cast<std::size_t>(config_.eval_contexts);
  const auto dps = static_cast<std::size_t>(layout_.data_parallel);
  const std::size_t lo = total * static_cast<std::size_t>(dp_) / dps;
  const std::size_t hi = total * static_cast<std::size_t>(dp_ + 1) / dps;
  std::vector<float> x = task_.contexts(BanditTask::kEvalContextBase + lo, hi - lo);
  Activations a;
  SH_RETURN_IF_ERROR(forward(x, hi - lo, a));
  float correct = 0;
  for (std::size_t i = 0; i < hi - lo; ++i) {
    const float* row = &a.logits[i * K];
    auto greedy = static_cast<int>(std::max_element(row, row + K) - row);
    if (greedy == task_.best_arm(&x[i * D])) correct += 1;
  }
  SH_RETURN_IF_ERROR(groups_.data->all_reduce_sum(dp_, &correct, 1));
  return double(correct) / double(total);
}

}  // namespace stagehand

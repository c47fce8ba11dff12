#include "bench/synthetic_state.hpp"

#include <algorithm>
#include <vector>

#include "stagehand/core/host_buffer.hpp"
#include "stagehand/core/random.hpp"

namespace stagehand {

namespace {

constexpr DType kDTypes[] = {DType::f32, DType::bf16, DType::f32, DType::f16, DType::i64, DType::u8};

}  // namespace

Result<StateDict> make_synthetic_state(const SyntheticStateSpec& spec, int rank, Device device) {
  if (spec.ranks < 1 || rank < 0 || rank >= spec.ranks || spec.tensors < 1 || spec.columns < 1) {
    return Status{ErrorCode::invalid_argument, "synthetic state needs ranks >= 1, 0 <= rank < ranks, tensors >= 1, columns >= 1"};
  }
  std::vector<double> weights;
  double weight_sum = 0;
  for (int i = 0; i < spec.tensors; ++i) {
    weights.push_back(1.0 + static_cast<double>(splitmix64(spec.seed ^ static_cast<std::uint64_t>(i)) % 8) / 4.0);
    weight_sum += weights.back();
  }
  StateDict state;
  for (int i = 0; i < spec.tensors; ++i) {
    DType dtype = kDTypes[static_cast<std::size_t>(i) % std::size(kDTypes)];
    std::size_t elem = dtype_size(dtype);
    auto bytes = static_cast<std::uint64_t>(static_cast<double>(spec.bytes_per_rank) * weights[static_cast<std::size_t>(i)] / weight_sum);
    const std::int64_t cols = spec.columns;
    std::int64_t rows = std::max<std::int64_t>(1, static_cast<std::int64_t>(bytes / elem) / cols);
    bool replicated = i % 4 == 3;
    Shape local{rows, cols};
    Shape global = replicated ? local : Shape{rows * spec.ranks, cols};
    Shape offset{replicated ? 0 : rows * rank, 0};
    auto tensor = Tensor::empty(dtype, local, device);
    if (!tensor.is_ok()) return tensor.status();
    // Host tensors are filled in place; device ones through a host buffer.
    HostBuffer host;
    if (device.is_cuda()) {
      host = HostBuffer(tensor->nbytes(), false, nullptr);
      if (!host.valid()) return Status{ErrorCode::no_space, "cannot allocate the synthetic state"};
    }
    std::uint8_t* fill = device.is_cuda() ? host.data() : static_cast<std::uint8_t*>(tensor->data());
    // Fill by global element position, 8 bytes of pseudo-random data per position.
    std::uint64_t tensor_seed = splitmix64(spec.seed * 1000003 + static_cast<std::uint64_t>(i));
    std::uint64_t first = static_cast<std::uint64_t>(offset[0] * cols);
    const auto elements = static_cast<std::uint64_t>(local.numel());
    for (std::uint64_t e = 0; e < elements; ++e) {
      std::uint64_t v = splitmix64(tensor_seed + first + e);
      std::copy_n(reinterpret_cast<const std::uint8_t*>(&v), elem, fill + e * elem);
    }
    if (device.is_cuda()) SH_RETURN_IF_ERROR(tensor->copy_from_host(host.data()));
    std::int32_t replica = replicated ? (rank - i % spec.ranks + spec.ranks) % spec.ranks : 0;
    state.add("layer" + std::to_string(i / 4) + ".param" + std::to_string(i % 4), std::move(*tensor),
              global, offset, replica);
  }
  state.objects["rng_state.rank" + std::to_string(rank)] =
      "{\"seed\": " + std::to_string(spec.seed) + ", \"rank\": " + std::to_string(rank) + "}";
  return state;
}

}  // namespace stagehand

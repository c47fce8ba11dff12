#define BOOST_TEST_MODULE weight_sync_test
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "stagehand/checkpoint/sync/weight_sync.hpp"

using namespace stagehand;

namespace {

/// Rows [begin, end) of `parts` nearly equal parts of `n` (the first parts one longer): uneven
/// splits too.
std::pair<std::int64_t, std::int64_t> part_of(std::int64_t n, int parts, int part) {
  const std::int64_t base = n / parts, extra = n % parts;
  const std::int64_t begin = part * base + std::min<std::int64_t>(part, extra);
  return {begin, begin + base + (part < extra ? 1 : 0)};
}

/// The value every layout must hold at a global element: depends on the tensor and the index.
float reference(const std::string& name, std::int64_t flat) {
  return static_cast<float>(name.size() * 1000 + static_cast<std::size_t>(name[0])) + static_cast<float>(flat) * 0.5f;
}

constexpr std::int64_t kRows = 8, kCols = 6;

/// One rank of a layout of `tp` tensor-parallel ranks times some replicas (rank = replica * tp +
/// tp rank): "qkv" split by rows (column-parallel), "proj" by columns (row-parallel), "norm"
/// whole on every rank. With `fill`, the blocks hold the reference values; else zeros.
StateDict rank_state(int tp, int rank, bool fill) {
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
      data[i] = fill ? reference(name, flat) : 0.0f;
    }
    state.add(name, std::move(tensor), global, offset, replica);
  };
  auto [r0, r1] = part_of(kRows, tp, t);
  add("qkv", Shape{kRows, kCols}, Shape{r0, 0}, Shape{r1 - r0, kCols});
  auto [c0, c1] = part_of(kCols, tp, t);
  add("proj", Shape{kRows, kCols}, Shape{0, c0}, Shape{kRows, c1 - c0});
  // Whole on every rank: a replica of every other rank's (replica id 0 on rank 0 only).
  {
    Tensor tensor = *Tensor::empty(DType::f32, Shape{kCols}, Device::host());
    for (std::int64_t i = 0; i < kCols; ++i) tensor.host_data<float>()[i] = fill ? reference("norm", i) : 0.0f;
    state.add("norm", std::move(tensor), Shape{kCols}, Shape{0}, rank == 0 ? 0 : 1);
  }
  return state;
}

std::vector<StateDict> layout(int tp, int dp, bool fill) {
  std::vector<StateDict> ranks;
  for (int r = 0; r < tp * dp; ++r) ranks.push_back(rank_state(tp, r, fill));
  return ranks;
}

std::vector<std::vector<ShardedTensorDesc>> descs(const std::vector<StateDict>& ranks) {
  std::vector<std::vector<ShardedTensorDesc>> out;
  for (const auto& r : ranks) out.push_back(r.descriptors());
  return out;
}

/// Every element of every receiver block equals the reference.
void check_exact(const std::vector<StateDict>& receivers) {
  for (std::size_t q = 0; q < receivers.size(); ++q) {
    for (const auto& t : receivers[q].tensors) {
      const float* data = static_cast<const float*>(t.tensor.data());
      const auto& d = t.desc;
      const std::int64_t cols = d.local_shape.rank() == 2 ? d.local_shape[1] : 1;
      for (std::int64_t i = 0; i < d.local_shape.numel(); ++i) {
        const std::int64_t flat = d.global_shape.rank() == 2
                                      ? (d.global_offset[0] + i / cols) * d.global_shape[1] + d.global_offset[1] + i % cols
                                      : d.global_offset[0] + i;
        if (data[i] != reference(d.name, flat)) {
          BOOST_FAIL("receiver " << q << " tensor " << d.name << " element " << i << ": " << data[i] << " != "
                                 << reference(d.name, flat));
        }
      }
    }
  }
}

std::vector<const StateDict*> pointers(const std::vector<StateDict>& states) {
  std::vector<const StateDict*> out;
  for (const auto& s : states) out.push_back(&s);
  return out;
}

std::vector<StateDict*> pointers(std::vector<StateDict>& states) {
  std::vector<StateDict*> out;
  for (auto& s : states) out.push_back(&s);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_receiver_gets_exactly_its_blocks_for_each_layout_pair) {
  // (trainer tp, dp) -> (inference tp, replicas), uneven splits among them (8 rows into 3).
  const std::vector<std::array<int, 4>> pairs = {
      {2, 2, 1, 2}, {2, 2, 4, 1}, {4, 1, 2, 3}, {1, 1, 4, 1}, {2, 2, 3, 1}, {4, 2, 1, 1}, {3, 1, 2, 2}};
  for (const auto& [tp, dp, itp, replicas] : pairs) {
    BOOST_TEST_CONTEXT("trainer " << tp << "x" << dp << " -> inference " << itp << "x" << replicas) {
      const auto senders = layout(tp, dp, true);
      auto receivers = layout(itp, replicas, false);
      auto plan = plan_weight_sync(descs(senders), descs(receivers));
      BOOST_REQUIRE_MESSAGE(plan.is_ok(), plan.status().to_string());
      for (int threads : {1, 3}) {
        for (auto& r : receivers) {
          for (auto& t : r.tensors) std::fill_n(t.tensor.host_data<float>(), t.desc.local_shape.numel(), -7.0f);
        }
        BOOST_REQUIRE(sync_in_process(*plan, pointers(senders), pointers(receivers), threads).is_ok());
        check_exact(receivers);
      }
      // Every receiver gets the bytes of its blocks, once.
      for (std::size_t q = 0; q < receivers.size(); ++q) {
        std::uint64_t bytes = 0;
        for (const auto& t : receivers[q].tensors) bytes += t.desc.nbytes();
        BOOST_TEST(plan->received_bytes[q] == bytes);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(replicas_are_sent_by_all_their_holders_not_gathered_to_rank_0) {
  // Trainer tp 2 x dp 2: each distinct block has two holders; the plan spreads them so that every
  // trainer rank sends, about its share.
  const auto senders = layout(2, 2, true);
  auto receivers = layout(1, 2, false);
  auto plan = plan_weight_sync(descs(senders), descs(receivers));
  BOOST_REQUIRE(plan.is_ok());
  std::uint64_t total = 0;
  for (std::uint64_t b : plan->sent_bytes) {
    BOOST_TEST(b > 0u);
    total += b;
  }
  const auto [least, most] = std::minmax_element(plan->sent_bytes.begin(), plan->sent_bytes.end());
  BOOST_TEST(*most <= 2 * *least);
  // Two receivers, each the whole model: each byte is sent once per receiver.
  std::uint64_t model = 0;
  for (const auto& t : receivers[0].tensors) model += t.desc.nbytes();
  BOOST_TEST(total == 2 * model);
}

BOOST_AUTO_TEST_CASE(a_receiver_the_trainers_cannot_serve_is_refused_by_name) {
  const auto senders = layout(2, 1, true);
  {
    auto receivers = layout(1, 1, false);
    receivers[0].add_full("lm_head", *Tensor::empty(DType::f32, Shape{4}, Device::host()));
    auto plan = plan_weight_sync(descs(senders), descs(receivers));
    BOOST_REQUIRE(!plan.is_ok());
    BOOST_TEST(plan.status().message().find("receiver 0's tensor 'lm_head' is held by no trainer rank") !=
                   std::string::npos,
               plan.status().message());
  }
  {
    StateDict other;
    other.add_full("qkv", *Tensor::empty(DType::bf16, Shape{kRows, kCols}, Device::host()));
    auto plan = plan_weight_sync(descs(senders), {other.descriptors()});
    BOOST_REQUIRE(!plan.is_ok());
    BOOST_TEST(plan.status().message().find("'qkv' is BF16 [8, 6], the trainer ranks' F32") != std::string::npos, plan.status().message());
  }
  {
    // Trainer blocks that leave rows out: the global plan's check, named.
    auto partial = layout(2, 1, true);
    partial.pop_back();
    auto plan = plan_weight_sync(descs(partial), descs(layout(1, 1, false)));
    BOOST_REQUIRE(!plan.is_ok());
    BOOST_TEST(plan.status().message().find("trainer ranks' blocks") != std::string::npos, plan.status().message());
  }
}

BOOST_AUTO_TEST_CASE(a_state_of_another_structure_than_planned_is_refused) {
  const auto senders = layout(2, 1, true);
  auto receivers = layout(1, 1, false);
  auto plan = plan_weight_sync(descs(senders), descs(receivers));
  BOOST_REQUIRE(plan.is_ok());
  auto other = layout(2, 1, false);
  Status st = sync_in_process(*plan, pointers(senders), pointers(other));
  BOOST_TEST(!st.is_ok());
  BOOST_TEST(st.message().find("the plan is for 2 sender(s) and 1 receiver(s), got 2 and 2") != std::string::npos,
             st.message());
  auto reshaped = layout(1, 1, false);
  reshaped[0].tensors.pop_back();
  st = sync_in_process(*plan, pointers(senders), pointers(reshaped));
  BOOST_TEST(st.message().find("receiver 0's state has other tensors or shapes") != std::string::npos, st.message());
}

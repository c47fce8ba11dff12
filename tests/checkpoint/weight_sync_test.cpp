#define BOOST_TEST_MODULE weight_sync_test
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "stagehand/checkpoint/sync/weight_sync.hpp"
#include "sync_layouts.hpp"

using namespace stagehand;

namespace {

using namespace sync_layouts;

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

#define BOOST_TEST_MODULE planner
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <random>
#include <set>

#include "stagehand/checkpoint/format/format.hpp"
#include "stagehand/checkpoint/save/planner.hpp"
#include "stagehand/checkpoint/save/writer.hpp"

using namespace stagehand;

namespace {

std::vector<ShardedTensorDesc> random_descs(std::uint32_t seed, int count) {
  std::mt19937 rng(seed);
  std::vector<ShardedTensorDesc> out;
  for (int i = 0; i < count; ++i) {
    std::int64_t rows = 1 + static_cast<std::int64_t>(rng() % 200);
    std::int64_t cols = 1 + static_cast<std::int64_t>(rng() % 64);
    DType dtype = kAllDTypes[rng() % std::size(kAllDTypes)];
    std::int32_t replica = (rng() % 5 == 0) ? 1 : 0;
    out.push_back({"t" + std::to_string(i), dtype, Shape{rows * 2, cols}, Shape{rows, 0},
                   Shape{rows, cols}, replica});
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(deterministic_for_the_same_input) {
  for (std::uint32_t seed : {1u, 2u, 3u}) {
    auto descs = random_descs(seed, 60);
    SavePlan a = plan_save(3, descs, 8);
    SavePlan b = plan_save(3, descs, 8);
    BOOST_REQUIRE(a.buckets.size() == b.buckets.size());
    for (std::size_t i = 0; i < a.buckets.size(); ++i) {
      BOOST_TEST(a.buckets[i].header == b.buckets[i].header);
      BOOST_TEST(a.buckets[i].data_bytes == b.buckets[i].data_bytes);
    }
    BOOST_TEST(a.signature == b.signature);
  }
}

BOOST_AUTO_TEST_CASE(buckets_are_balanced) {
  for (int buckets : {1, 2, 3, 8}) {
    for (std::uint32_t seed : {5u, 6u, 7u, 8u}) {
      auto descs = random_descs(seed, 40);
      SavePlan plan = plan_save(0, descs, buckets);
      std::uint64_t largest_item = 0;
      for (const auto& b : plan.buckets) {
        for (const auto& item : b.items) largest_item = std::max(largest_item, item.nbytes);
      }
      auto [lo, hi] = std::minmax_element(
          plan.buckets.begin(), plan.buckets.end(),
          [](const PlannedBucket& a, const PlannedBucket& b) { return a.data_bytes < b.data_bytes; });
      BOOST_TEST(hi->data_bytes - lo->data_bytes <= largest_item);
    }
  }
}

BOOST_AUTO_TEST_CASE(replicas_are_dropped_and_every_primary_kept) {
  auto descs = random_descs(11, 50);
  SavePlan plan = plan_save(0, descs, 4);
  std::set<std::string> planned;
  for (const auto& b : plan.buckets) {
    for (const auto& item : b.items) {
      BOOST_TEST(descs[item.tensor_index].replica_id == 0);
      BOOST_TEST(planned.insert(descs[item.tensor_index].chunk_key()).second);
    }
  }
  std::size_t primaries = std::count_if(descs.begin(), descs.end(),
                                        [](const ShardedTensorDesc& d) { return d.replica_id == 0; });
  BOOST_TEST(planned.size() == primaries);
}

BOOST_AUTO_TEST_CASE(file_names_and_layout_are_fixed_at_planning) {
  auto descs = random_descs(21, 30);
  SavePlan plan = plan_save(7, descs, 3);
  for (int b = 0; b < 3; ++b) {
    const auto& bucket = plan.buckets[static_cast<std::size_t>(b)];
    BOOST_TEST(bucket.index == b);
    BOOST_TEST(bucket.file_name == "__7_" + std::to_string(b) + ".safetensors");
    BOOST_TEST(bucket.header.size() % kDataAlignment == 0u);
    std::uint64_t offset = 0;
    for (const auto& item : bucket.items) {
      BOOST_TEST(item.data_offset == offset);
      offset += item.nbytes;
    }
    BOOST_TEST(offset == bucket.data_bytes);
  }
}

BOOST_AUTO_TEST_CASE(empty_buckets_are_handled) {
  std::vector<ShardedTensorDesc> descs = {
      {"a", DType::f32, Shape{4}, Shape{0}, Shape{4}, 0},
      {"b", DType::f32, Shape{4}, Shape{0}, Shape{4}, 1},
  };
  SavePlan plan = plan_save(0, descs, 4);
  BOOST_TEST(plan.buckets.size() == 4u);
  BOOST_TEST(plan.buckets[0].items.size() == 1u);
  for (int b = 1; b < 4; ++b) {
    BOOST_TEST(plan.buckets[static_cast<std::size_t>(b)].items.empty());
    BOOST_TEST(plan.buckets[static_cast<std::size_t>(b)].data_bytes == 0u);
    BOOST_TEST(plan.buckets[static_cast<std::size_t>(b)].header.size() == kDataAlignment);
  }
  SavePlan none = plan_save(0, std::vector<ShardedTensorDesc>{}, 2);
  BOOST_TEST(none.data_bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(signature_follows_structure) {
  auto descs = random_descs(31, 10);
  auto changed = descs;
  changed[3].replica_id = 2;
  BOOST_TEST(structure_signature(descs) != structure_signature(changed));
  changed = descs;
  BOOST_TEST(structure_signature(descs) == structure_signature(changed));
}

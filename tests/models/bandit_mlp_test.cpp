#define BOOST_TEST_MODULE bandit_mlp
#include <boost/test/unit_test.hpp>

#include <numeric>

#include <thread>

#include "tests/checkpoint_test_util.hpp"
#include "stagehand/checkpoint/interop/export.hpp"
#include "stagehand/checkpoint/save/global_plan.hpp"
#include "stagehand/checkpoint/save/in_process_save.hpp"
#include "stagehand/checkpoint/load/loader.hpp"
#include "stagehand/checkpoint/load/checkpoint_reader.hpp"
#include "stagehand/checkpoint/load/load_plan.hpp"
#include "stagehand/checkpoint/load/resolve.hpp"
#include "stagehand/checkpoint/load/verify.hpp"
#include "stagehand/config/load.hpp"
#include "stagehand/models/bandit_limits.hpp"
#include "stagehand/storage/default_file_system.hpp"
#include "stagehand/models/bandit_mlp.hpp"
#include "stagehand/models/gemm.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;
using stagehand::test::TempDir;

namespace {

ModelConfig small_model() {
  ModelConfig m;
  m.hidden = 32;
  m.batch_size = 16;
  return m;
}

/// A world of models, one per rank, trained in parallel threads (collectives block).
struct Models {
  ParallelLayout layout;
  std::vector<std::unique_ptr<BanditMlp>> ranks;

  explicit Models(ParallelLayout l, std::shared_ptr<WeightStore> weights = nullptr) : layout(l) {
    auto groups = make_host_groups(layout);
    for (int r = 0; r < layout.world_size(); ++r) {
      ranks.push_back(std::move(*BanditMlp::create(small_model(), 3, layout, r, groups[static_cast<std::size_t>(r)], weights)));
    }
  }

  std::vector<StepMetrics> step(std::int64_t step, Objective objective) {
    std::vector<StepMetrics> out(ranks.size());
    std::vector<std::thread> threads;
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      threads.emplace_back([&, r] { out[r] = *ranks[r]->train_step(step, objective, {}); });
    }
    for (auto& t : threads) t.join();
    return out;
  }

  double accuracy() {
    std::vector<double> out(ranks.size());
    std::vector<std::thread> threads;
    for (std::size_t r = 0; r < ranks.size(); ++r) threads.emplace_back([&, r] { out[r] = *ranks[r]->evaluate(); });
    for (auto& t : threads) t.join();
    for (double a : out) BOOST_TEST(a == out[0]);
    return out[0];
  }

  /// Saves every rank's state as checkpoint `step` under `root`.
  void save(const std::string& root, std::int64_t step) {
    std::vector<std::unique_ptr<SaveEngine>> engines;
    std::vector<SaveEngine*> e;
    std::vector<const StateDict*> s;
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      engines.push_back(*SaveEngine::create(static_cast<int>(r), {2, 0, false, {}}));
      e.push_back(engines.back().get());
      s.push_back(ranks[r]->state().get());
    }
    auto saved = save_checkpoint_in_process(root, step, e, s);
    BOOST_REQUIRE_MESSAGE(saved.is_ok(), saved.status().to_string());
  }

  /// Loads `dir` into every rank as a Worker does (the model's selection for `scope`, then
  /// on_loaded); each rank's report.
  std::vector<LoadReport> load(const std::string& dir, const LoadScope& scope) {
    std::vector<LoadReport> reports(ranks.size());
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      const LoadOptions options = ranks[r]->load_selection(scope);
      Status st = load_checkpoint(*local_file_system(), dir, *ranks[r]->state(), options, &reports[r]);
      if (st.is_ok()) st = ranks[r]->on_loaded(scope, reports[r]);
      BOOST_REQUIRE_MESSAGE(st.is_ok(), "rank " << r << ": " << st.to_string());
    }
    return reports;
  }
};

/// Every tensor of a checkpoint whole, as its bytes by name: assembled from its chunks.
std::map<std::string, std::string> gathered(const std::string& dir) {
  auto metadata = read_checkpoint_metadata(dir, ObjectStoreOptions{});
  BOOST_REQUIRE(metadata.is_ok());
  StateDict whole;
  for (const auto& [name, t] : metadata->tensors) {
    whole.add_full(name, *Tensor::empty(t.dtype, t.global_shape, Device::host()));
  }
  BOOST_REQUIRE(load_checkpoint(dir, whole).is_ok());
  std::map<std::string, std::string> out;
  for (const auto& t : whole.tensors) {
    out[t.desc.name] = std::string(static_cast<const char*>(t.tensor.data()), t.tensor.nbytes());
  }
  return out;
}

/// Every tensor of a safetensors folder, read whole as f32 bytes by name.
std::map<std::string, std::string> gathered_safetensors(const std::string& dir) {
  auto single = parse_safetensors_header(dir + "/model.safetensors");
  BOOST_REQUIRE_MESSAGE(single.is_ok(), single.status().to_string());
  StateDict whole;
  for (const auto& e : single->entries) whole.add_full(e.key, *Tensor::empty(e.dtype, e.shape, Device::host()));
  BOOST_REQUIRE(load_checkpoint(dir, whole).is_ok());
  std::map<std::string, std::string> out;
  for (const auto& t : whole.tensors) {
    BOOST_TEST((t.desc.dtype == DType::f32));
    out[t.desc.name] = std::string(static_cast<const char*>(t.tensor.data()), t.tensor.nbytes());
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(state_looks_like_a_megatron_model) {
  Models world({2, 2});
  const StateDict& rank3 = *world.ranks[3]->state();  // tensor index 1, data index 1
  std::map<std::string, ShardedTensorDesc> by_name;
  for (const auto& t : rank3.tensors) by_name[t.desc.name] = t.desc;
  BOOST_TEST((by_name["model.fc1.weight"].dtype == DType::bf16));
  BOOST_TEST((by_name["model.fc1.weight"].global_offset == Shape{16, 0}));  // column-parallel
  BOOST_TEST((by_name["model.fc2.weight"].global_offset == Shape{0, 16}));  // row-parallel
  BOOST_TEST(by_name["model.fc1.weight"].replica_id >= 0);  // one of two data-parallel replicas
  BOOST_TEST((by_name["optimizer.main.model.fc1.weight"].dtype == DType::f32));
  BOOST_TEST(by_name["optimizer.main.model.fc1.weight"].replica_id == 0);     // sharded over data-parallel
  // The optimizer state has the parameter's global shape; data-parallel rank 1 holds the second
  // half of the rows of tensor-parallel rank 1's block.
  BOOST_TEST((by_name["optimizer.exp_avg.model.fc1.weight"].global_shape == Shape{32, 16}));
  BOOST_TEST((by_name["optimizer.exp_avg.model.fc1.weight"].local_shape == Shape{8, 16}));
  BOOST_TEST((by_name["optimizer.exp_avg.model.fc1.weight"].global_offset == Shape{24, 0}));
  BOOST_TEST((by_name["optimizer.exp_avg.model.fc2.weight"].global_offset == Shape{4, 16}));
  BOOST_TEST(rank3.objects.count("rng.rank3") == 1u);
  BOOST_TEST(rank3.objects.count("scheduler") == 1u);
}

BOOST_AUTO_TEST_CASE(every_element_is_saved_once_across_the_world) {
  Models world({2, 2});
  world.step(1, Objective::rl);
  TempDir dir;
  std::vector<std::unique_ptr<SaveEngine>> engines;
  std::vector<SaveEngine*> e;
  std::vector<const StateDict*> s;
  for (int r = 0; r < 4; ++r) {
    engines.push_back(*SaveEngine::create(r, {2, 0, false, {}}));
    e.push_back(engines.back().get());
    s.push_back(world.ranks[static_cast<std::size_t>(r)]->state().get());
  }
  // Commit checks that chunks cover every tensor exactly: replicas dropped, nothing missing.
  auto saved = save_checkpoint_in_process(dir.path(), 1, e, s);
  BOOST_TEST(saved.is_ok(), saved.status().to_string());
}

BOOST_AUTO_TEST_CASE(replicated_weights_are_written_by_one_replica_each_spread_over_the_ranks) {
  for (ParallelLayout layout : {ParallelLayout{2, 2}, ParallelLayout{1, 4}, ParallelLayout{2, 1}}) {
    BOOST_TEST_CONTEXT("tensor " << layout.tensor_parallel << " x data " << layout.data_parallel) {
      Models world(layout);
      // Who writes each chunk (name and offset), and how many bytes each rank writes; and the
      // same if the first replica (data index 0, tensor index 0) wrote every replicated chunk.
      // The save's global plan chooses the writers (the model gives every replica id 0).
      std::map<std::string, int> writers;
      std::map<std::string, int> holders;
      std::vector<double> written(world.ranks.size(), 0);
      std::vector<double> first_replica(world.ranks.size(), 0);
      double largest_replicated = 0;
      std::vector<LocalPlan> locals;
      for (std::size_t r = 0; r < world.ranks.size(); ++r) {
        locals.push_back({static_cast<int>(r), 1, 0, false, world.ranks[r]->state()->descriptors(), {}});
      }
      std::vector<const LocalPlan*> plans;
      for (const auto& p : locals) plans.push_back(&p);
      auto global = make_global_plan(plans);
      BOOST_REQUIRE_MESSAGE(global.is_ok(), global.status().to_string());
      for (std::size_t r = 0; r < world.ranks.size(); ++r) {
        for (const auto& t : world.ranks[r]->state()->tensors) ++holders[t.desc.chunk_key()];
        for (std::uint32_t i : global->writes[r]) {
          const ShardedTensorDesc& d = locals[r].tensors[i];
          ++writers[d.chunk_key()];
          written[r] += static_cast<double>(d.nbytes());
        }
      }
      for (std::size_t r = 0; r < world.ranks.size(); ++r) {
        for (const auto& t : world.ranks[r]->state()->tensors) {
          const bool replicated = holders[t.desc.chunk_key()] > 1;
          if (replicated) largest_replicated = std::max(largest_replicated, static_cast<double>(t.desc.nbytes()));
          const int rank = static_cast<int>(r);
          const bool first = t.desc.name.rfind("optimizer.", 0) == 0 ? layout.tensor_index(rank) == 0
                                                                     : layout.data_index(rank) == 0 &&
                                                                           (t.desc.name != "model.fc2.bias" ||
                                                                            layout.tensor_index(rank) == 0);
          if (!replicated || first) first_replica[r] += static_cast<double>(t.desc.nbytes());
        }
      }
      for (const auto& [key, count] : holders) BOOST_TEST(writers[key] == 1, key << " has " << writers[key] << " writers");
      const double mean = std::accumulate(written.begin(), written.end(), 0.0) / static_cast<double>(written.size());
      const double most = *std::max_element(written.begin(), written.end());
      // No rank writes more than its share plus one chunk (the greedy's bound), and the busiest
      // rank writes less than the first replica would if it wrote every replicated chunk.
      BOOST_TEST(most <= mean + largest_replicated);
      if (layout.world_size() > 2) BOOST_TEST(most < *std::max_element(first_replica.begin(), first_replica.end()));
    }
  }
}

BOOST_AUTO_TEST_CASE(balanced_writers_are_deterministic_and_prefer_the_least_loaded) {
  std::vector<ReplicatedChunk> chunks{{"a", 10, {0, 1}}, {"b", 10, {0, 1}}, {"c", 30, {0, 1, 2}}, {"d", 5, {2}}};
  auto writers = balance_writers(chunks, {0, 0, 25});
  // c (30) first: ranks 0 and 1 tie at 0, the lower wins; then a and b (10, key order) go to the lighter.
  BOOST_TEST((writers == std::vector<int>{1, 1, 0, 2}));
  BOOST_TEST((balance_writers(chunks, {0, 0, 25}) == writers));
}

BOOST_AUTO_TEST_CASE(parallel_layouts_agree_and_training_learns) {
  Models single({1, 1});
  Models parallel({2, 2});
  double before = single.accuracy();
  BOOST_TEST(before == parallel.accuracy());
  for (std::int64_t step = 1; step <= 60; ++step) {
    auto a = single.step(step, Objective::sft);
    auto b = parallel.step(step, Objective::sft);
    BOOST_TEST(a[0].loss == b[0].loss, boost::test_tools::tolerance(0.05));
    for (const auto& m : b) BOOST_TEST(m.loss == b[0].loss);
  }
  BOOST_TEST(single.accuracy() > before + 0.3);
  BOOST_TEST(parallel.accuracy() > before + 0.3);
}

BOOST_AUTO_TEST_CASE(exported_weights_let_generators_sample_like_the_policy) {
  auto store = std::make_shared<WeightStore>(2, 16, 8, 32);
  Models world({2, 1}, store);
  // Each rank's thread records its export's status; the test's thread checks them (Boost.Test's
  // macros are not thread-safe).
  std::vector<Status> exported(world.ranks.size(), Status::ok());
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < world.ranks.size(); ++r)
    threads.emplace_back([&, r] { exported[r] = world.ranks[r]->export_weights(0); });
  for (auto& t : threads) t.join();
  for (std::size_t r = 0; r < exported.size(); ++r)
    BOOST_TEST(exported[r].is_ok(), "rank " << r << ": " << exported[r].to_string());
  auto weights = store->wait_for(0, std::chrono::seconds(5));
  BOOST_REQUIRE(weights.is_ok());
  BanditTask task(3, 16, 8);
  auto actions = generate_actions(task, **weights, 8, 0, 16);
  BOOST_TEST(actions.size() == 128u);
  for (auto a : actions) BOOST_TEST((a >= 0 && a < 8));
  // Training on those actions is the same step as sampling them on-policy at version 0.
  Models on_policy({2, 1});
  Models off_policy({2, 1});
  std::vector<std::int32_t> batch = generate_actions(task, **weights, 8, 16, 16);
  std::vector<StepMetrics> a(2);
  std::vector<StepMetrics> b(2);
  std::vector<std::thread> t2;
  for (std::size_t r = 0; r < 2; ++r) {
    t2.emplace_back([&, r] { a[r] = *on_policy.ranks[r]->train_step(1, Objective::rl, {}); });
    t2.emplace_back([&, r] { b[r] = *off_policy.ranks[r]->train_step(1, Objective::rl, batch); });
  }
  for (auto& t : t2) t.join();
  BOOST_TEST(a[0].reward == b[0].reward);
  BOOST_TEST(store->wait_for(5, std::chrono::milliseconds(10)).status().code() == ErrorCode::timeout);
}

BOOST_AUTO_TEST_CASE(matrix_products_match_a_reference_on_the_default_device) {
  // cuBLAS on a machine with a GPU, OpenBLAS otherwise; both against a plain triple loop.
  auto gemm = *Gemm::create(default_device(0));
  BOOST_TEST_MESSAGE("products on " << gemm->device().to_string());
  const int m = 7, n = 5, k = 9;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n));
      for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 37 % 11)) - 5.0f;
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 17 % 7)) - 3.0f;
      // Stored as op(A) [m, k] and op(B) [k, n] would be read: A is [k, m] when transposed.
      auto at = [&](int i, int p) { return ta ? a[static_cast<std::size_t>(p * m + i)] : a[static_cast<std::size_t>(i * k + p)]; };
      auto bt = [&](int p, int j) { return tb ? b[static_cast<std::size_t>(j * k + p)] : b[static_cast<std::size_t>(p * n + j)]; };
      std::vector<float> c(static_cast<std::size_t>(m * n), -1.0f);
      BOOST_REQUIRE(gemm->multiply(ta, tb, m, n, k, a.data(), ta ? m : k, b.data(), tb ? k : n, c.data(), n).is_ok());
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
          float expected = 0;
          for (int p = 0; p < k; ++p) expected += at(i, p) * bt(p, j);
          BOOST_TEST(c[static_cast<std::size_t>(i * n + j)] == expected, "trans " << ta << tb << " at " << i << "," << j);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_checkpoint_loads_under_any_layout_with_the_same_weights_and_moments) {
  Models saved({2, 2});
  for (std::int64_t step = 1; step <= 6; ++step) saved.step(step, Objective::sft);
  const double accuracy_at_save = saved.accuracy();
  TempDir dir;
  saved.save(dir / "a", 6);
  const std::string ckpt = dir / "a/global_step_6";
  const auto before = gathered(ckpt);
  BOOST_TEST(before.size() == 16u);  // 4 parameters: weights, main weights, 2 moments
  // How the 2 x 2 run goes on: the reference for every other layout.
  std::vector<double> losses;
  for (std::int64_t step = 7; step <= 16; ++step) losses.push_back(saved.step(step, Objective::sft)[0].loss);

  for (ParallelLayout layout : {ParallelLayout{1, 1}, ParallelLayout{1, 2}, ParallelLayout{2, 1}, ParallelLayout{4, 1},
                                ParallelLayout{2, 4}}) {
    BOOST_TEST_CONTEXT("tensor " << layout.tensor_parallel << " x data " << layout.data_parallel) {
      Models resumed(layout);
      auto reports = resumed.load(ckpt, LoadScope{});
      for (std::size_t r = 0; r < reports.size(); ++r) {
        BOOST_TEST(resumed.ranks[r]->optimizer_step() == 6);
        // Ranks the 4-rank save had no RNG for re-derive theirs.
        const std::vector<std::string> missing = r < 4 ? std::vector<std::string>{}
                                                        : std::vector<std::string>{"rng.rank" + std::to_string(r)};
        BOOST_TEST(reports[r].missing_objects == missing, "rank " << r);
        BOOST_TEST(reports[r].unused_tensors.empty());
      }
      // Saved again from this layout, every tensor gathers to the same bytes.
      const std::string again = dir / ("l" + std::to_string(layout.tensor_parallel) + std::to_string(layout.data_parallel));
      resumed.save(again, 6);
      const auto after = gathered(again + "/global_step_6");
      BOOST_TEST(after.size() == before.size());
      for (const auto& [name, bytes] : before) BOOST_TEST((after.count(name) == 1 && after.at(name) == bytes), name);
      // And training goes on as it does in the 2 x 2 layout (up to the order of sums).
      BOOST_TEST(resumed.accuracy() == accuracy_at_save);
      for (std::int64_t step = 7; step <= 16; ++step) {
        BOOST_TEST(resumed.step(step, Objective::sft)[0].loss == losses[static_cast<std::size_t>(step - 7)],
                   boost::test_tools::tolerance(0.02));
      }
      BOOST_TEST(resumed.accuracy() > accuracy_at_save);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_weights_only_load_restarts_the_optimizer_from_the_saved_weights) {
  Models saved({2, 2});
  for (std::int64_t step = 1; step <= 5; ++step) saved.step(step, Objective::sft);
  TempDir dir;
  saved.save(dir / "a", 5);
  const auto before = gathered(dir / "a/global_step_5");
  Models fresh({1, 2});
  fresh.load(dir / "a/global_step_5", LoadScope{false, false, true});
  for (const auto& rank : fresh.ranks) BOOST_TEST(rank->optimizer_step() == 0);
  fresh.save(dir / "b", 1);
  const auto after = gathered(dir / "b/global_step_1");
  for (const char* p : {"model.fc1.weight", "model.fc1.bias", "model.fc2.weight", "model.fc2.bias"}) {
    const std::string name = p;
    BOOST_TEST((after.at(name) == before.at(name)), name);
    // The fp32 main weights are the saved bf16 weights, widened; the moments start at zero.
    const std::string& bf16 = before.at(name);
    std::string widened(bf16.size() * 2, '\0');
    BOOST_REQUIRE(convert_elements(bf16.data(), DType::bf16, widened.data(), DType::f32, bf16.size() / 2).is_ok());
    BOOST_TEST((after.at("optimizer.main." + name) == widened), name);
    BOOST_TEST((after.at("optimizer.main." + name) != before.at("optimizer.main." + name)), name);
    BOOST_TEST((after.at("optimizer.exp_avg." + name) == std::string(widened.size(), '\0')), name);
  }
}

BOOST_AUTO_TEST_CASE(an_export_asked_to_stop_fails_as_aborted_and_leaves_no_output) {
  // stagehand-train stops a running export when the run ends on a signal or an error: it leaves
  // nothing (the step stays owed), and a later export of the step is whole.
  Models saved({2, 2});
  saved.step(1, Objective::sft);
  TempDir dir;
  saved.save(dir / "a", 1);
  ExportOptions options;
  options.max_shard_bytes = 1;  // a file a tensor: a batch each
  int asked = 0;
  options.should_stop = [&] { return ++asked > 2; };
  Status st = export_checkpoint(*local_file_system(), dir / "a", dir / "hf", options);
  BOOST_TEST(st.code() == ErrorCode::aborted, st.to_string());
  BOOST_TEST(st.message().find("the run is stopping") != std::string::npos, st.message());
  BOOST_TEST(asked == 3);
  BOOST_TEST(!std::filesystem::exists(dir / "hf"));
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    BOOST_TEST(e.path().filename().string().find(".export-") == std::string::npos, e.path());
  }
  ExportOptions fp32;
  fp32.dtype = DType::f32;
  BOOST_REQUIRE(export_checkpoint(*local_file_system(), dir / "a", dir / "hf", fp32).is_ok());
  BOOST_TEST(gathered_safetensors(dir / "hf").size() == 4u);
}

BOOST_AUTO_TEST_CASE(an_fp32_export_started_from_gives_bit_identical_fp32_weights) {
  Models saved({2, 2});
  for (std::int64_t step = 1; step <= 5; ++step) saved.step(step, Objective::sft);
  TempDir dir;
  saved.save(dir / "a", 5);
  ExportOptions fp32;
  fp32.dtype = DType::f32;
  BOOST_REQUIRE(export_checkpoint(*local_file_system(), dir / "a", dir / "hf", fp32).is_ok());
  const auto exported = gathered_safetensors(dir / "hf");
  BOOST_TEST(exported.size() == 4u);
  // Started from the export (another layout, weights only), then saved: the fp32 main weights
  // are the exported fp32 tensors bit for bit, the bf16 weights those first saved.
  Models fresh({4, 1});
  auto reports = fresh.load(dir / "hf", LoadScope{false, false, true});
  for (const auto& report : reports) BOOST_TEST(report.unused_tensors.empty());
  fresh.save(dir / "b", 1);
  const auto before = gathered(dir / "a/global_step_5");
  const auto after = gathered(dir / "b/global_step_1");
  for (const auto& [name, bytes] : exported) {
    BOOST_TEST((after.at("optimizer.main." + name) == bytes), name);
    BOOST_TEST((after.at(name) == before.at(name)), name);
  }
}

// -- the reference model's limits (bandit_limits.hpp) on a loaded config --

namespace {

/// Loads `yaml` with `overrides` as stagehand-train does, and returns what the model's own
/// limits say of it. The config's own rules accept it: what fails, fails in models/.
Status model_limits_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  auto config = load_config_string(yaml, "bad.yaml", overrides);
  BOOST_REQUIRE_MESSAGE(config.is_ok(), config.status());
  return validate_bandit_config(*config);
}

}  // namespace

// Sizes that the config's ranges allow but whose matrices, layout or contexts the model cannot
// run with: the error gives the limit, the key and its line.
BOOST_AUTO_TEST_CASE(model_limits_refuse_what_the_model_cannot_run) {
  struct Case {
    const char* name;
    const char* yaml;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"hidden not divisible",
       "parallel:\n  tensor_parallel: 3\nmodel:\n  hidden: 64\n",
       {"bad.yaml:4", "model.hidden", "divisible by parallel.tensor_parallel (3)"}},
      {"fc1 too large",
       "model:\n  context_dim: 1048576\n  hidden: 16777216\n",
       {"bad.yaml:3", "model.hidden", "model.hidden x model.context_dim", "17592186044416",
        "2147483647"}},
      {"fc2 too large",
       "model:\n  num_arms: 1048576\n  hidden: 16777216\n",
       {"bad.yaml:3", "model.hidden", "model.hidden x model.num_arms", "2147483647"}},
      {"task rule too large",
       "model:\n  context_dim: 1048576\n  num_arms: 1048576\n",
       {"bad.yaml:3", "model.num_arms", "model.num_arms x model.context_dim", "2147483647"}},
      {"activations too large",
       "model:\n  hidden: 16777216\n  batch_size: 16777216\n",
       {"bad.yaml:3", "model.batch_size", "model.batch_size x model.hidden", "2147483647"}},
      {"actions too many",
       "model:\n  batch_size: 16777216\n  group_size: 65536\n",
       {"bad.yaml:2", "model.batch_size", "model.batch_size x model.group_size", "2147483647"}},
      {"evaluation too large",
       "model:\n  hidden: 16777216\n  eval_contexts: 16777216\n",
       {"bad.yaml:3", "model.eval_contexts", "model.eval_contexts x model.hidden", "2147483647"}},
      {"steps into the evaluation contexts",
       "trainer:\n  total_steps: 100000000000\nmodel:\n  batch_size: 64\n",
       {"bad.yaml:2", "trainer.total_steps", "at most 17179869183", "1099511627776",
        "got 100000000000"}},
      {"steps overflowing int64",
       "trainer:\n  total_steps: 9223372036854775807\n",
       {"bad.yaml:2", "trainer.total_steps", "at most 17179869183"}},
  };
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.name) {
      Status st = model_limits_of(c.yaml);
      BOOST_TEST(st.code() == ErrorCode::config_error, st);
      for (const auto& needle : c.expect) {
        BOOST_TEST(st.message().find(needle) != std::string::npos, needle << " not in: " << st);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(model_limits_accept_the_largest_sizes_the_model_runs) {
  const std::vector<std::string> limits = {
      "trainer:\n  total_steps: 17179869183\nmodel:\n  batch_size: 64\n",
      "trainer:\n  kind: fully_async\n  total_steps: 17179869182\n",
      "model:\n  hidden: 16777216\n  context_dim: 127\n  num_arms: 127\n  batch_size: 127\n"
      "  eval_contexts: 127\n",
      "model:\n  batch_size: 32768\n  group_size: 65535\n",
      "parallel:\n  tensor_parallel: 4\n  data_parallel: 8\n",
  };
  for (const auto& yaml : limits)
    BOOST_TEST(model_limits_of(yaml).is_ok(), yaml);
}

// Each limit fires once, from models/, naming the key it blames and where that key (or the first
// other key of the limit that was given) was given: a line of the file or an override.
BOOST_AUTO_TEST_CASE(each_model_limit_fires_once_naming_its_key_and_where_it_was_given) {
  struct Case {
    std::string yaml;
    std::vector<std::string> overrides;
    std::string message;
  };
  const std::string matrix = " (2^31 - 1) that one matrix may hold";
  const std::string contexts =
      ": the contexts a run trains on must end before the evaluation "
      "contexts, which begin at context 1099511627776 (2^40); got ";
  const std::vector<Case> cases = {
      {"parallel:\n  tensor_parallel: 3\nmodel:\n  hidden: 64\n",
       {},
       "bad.yaml:4: model.hidden: must be divisible by parallel.tensor_parallel (3), got 64"},
      {"trainer:\n  total_steps: 5\nmodel:\n  hidden: 64\n",
       {"parallel.tensor_parallel=3"},
       "bad.yaml:4: model.hidden: must be divisible by parallel.tensor_parallel (3), got 64"},
      {"trainer:\n  total_steps: 5\nmodel:\n  hidden: 64\n",
       {"model.hidden=100", "parallel.tensor_parallel=3"},
       "--set model.hidden=100: model.hidden: must be divisible by parallel.tensor_parallel (3), "
       "got 100"},
      {"",
       {"parallel.tensor_parallel=3"},
       "--set parallel.tensor_parallel=3: model.hidden: must be divisible by "
       "parallel.tensor_parallel (3), got 64"},
      {"",
       {"parallel.data_parallel=3"},
       "--set parallel.data_parallel=3: model.batch_size: must be divisible by "
       "parallel.data_parallel (3), got 64"},
      {"model:\n  context_dim: 1048576\n  hidden: 16777216\n",
       {},
       "bad.yaml:3: model.hidden: model.hidden x model.context_dim = 16777216 x 1048576 = "
       "17592186044416 elements in model.fc1.weight, more than the 2147483647" +
           matrix},
      {"",
       {"model.batch_size=16777216", "model.group_size=65536"},
       "--set model.batch_size=16777216: model.batch_size: model.batch_size x model.group_size = "
       "16777216 x 65536 = 1099511627776 elements in a step's sampled actions, more than the "
       "2147483647" +
           matrix},
      {"trainer:\n  total_steps: 100000000000\nmodel:\n  batch_size: 64\n",
       {},
       "bad.yaml:2: trainer.total_steps: must be at most 17179869183 with model.batch_size 64" +
           contexts + "100000000000"},
      {"",
       {"trainer.kind=fully_async", "trainer.total_steps=17179869183"},
       "--set trainer.total_steps=17179869183: trainer.total_steps: must be at most 17179869182 "
       "with model.batch_size 64 and fully_async.max_staleness_steps 1" +
           contexts + "17179869183"},
  };
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.message) {
      Status st = model_limits_of(c.yaml, c.overrides);
      BOOST_TEST(st.code() == ErrorCode::config_error);
      BOOST_TEST(st.message() == c.message);
    }
  }
}

// A model built in code checks its layout with the same rule; without a loaded config the error
// names the key alone.
BOOST_AUTO_TEST_CASE(create_refuses_a_layout_that_does_not_divide_the_model) {
  const ParallelLayout layout{3, 1};
  auto groups = make_host_groups(layout);
  auto model = BanditMlp::create(small_model(), 3, layout, 0, groups[0]);
  BOOST_REQUIRE(!model.is_ok());
  BOOST_TEST(model.status().message() ==
             "model.hidden: must be divisible by parallel.tensor_parallel (3), got 32");
}

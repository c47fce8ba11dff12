#define BOOST_TEST_MODULE load
#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>

#include "bench/synthetic_state.hpp"
#include "stagehand/checkpoint/commit.hpp"
#include "stagehand/checkpoint/in_process_save.hpp"
#include "stagehand/checkpoint/loader.hpp"
#include "stagehand/core/device.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;
using stagehand::test::TempDir;

namespace {

Status save_states(const std::string& root, std::int64_t step, std::vector<StateDict>& states, int threads = 2) {
  std::vector<std::unique_ptr<SaveEngine>> engines;
  std::vector<SaveEngine*> e;
  std::vector<const StateDict*> s;
  for (std::size_t r = 0; r < states.size(); ++r) {
    bool on_gpu = !states[r].tensors.empty() && states[r].tensors[0].tensor.device().is_cuda();
    engines.push_back(*SaveEngine::create(static_cast<int>(r), {threads, 0, on_gpu, {}}));
    e.push_back(engines.back().get());
    s.push_back(&states[r]);
  }
  return save_checkpoint_in_process(root, step, e, s).status();
}

/// One tensor of every dtype, split in two along dimension 0 over two ranks, plus a scalar.
std::vector<StateDict> every_dtype_state() {
  std::vector<StateDict> states(2);
  std::uint32_t seed = 1;
  for (DType dtype : kAllDTypes) {
    std::string name = "w_" + std::string(dtype_name(dtype));
    for (int r = 0; r < 2; ++r) {
      states[static_cast<std::size_t>(r)].add(name, test::random_tensor(dtype, Shape{5, 3}, seed++),
                                              Shape{10, 3}, Shape{5 * r, 0});
    }
  }
  for (int r = 0; r < 2; ++r) {
    states[static_cast<std::size_t>(r)].add_full("step", test::random_tensor(DType::i64, Shape{}, 99), r);
  }
  states[0].objects["scheduler"] = R"({"step": 17})";
  return states;
}

void flip_byte(const std::string& path, std::uint64_t offset) {
  int fd = ::open(path.c_str(), O_RDWR);
  std::uint8_t b = 0;
  BOOST_REQUIRE(::pread(fd, &b, 1, static_cast<off_t>(offset)) == 1);
  b ^= 0x40;
  BOOST_REQUIRE(::pwrite(fd, &b, 1, static_cast<off_t>(offset)) == 1);
  ::close(fd);
}

}  // namespace

BOOST_AUTO_TEST_CASE(round_trip_every_dtype) {
  TempDir dir;
  auto states = every_dtype_state();
  BOOST_REQUIRE(save_states(dir.path(), 3, states).is_ok());
  auto ckpt = resolve_checkpoint(dir.path());
  BOOST_REQUIRE(ckpt.is_ok());
  BOOST_TEST(*ckpt == dir / "global_step_3");
  for (std::size_t r = 0; r < 2; ++r) {
    StateDict loaded = test::zeroed_like(states[r]);
    loaded.objects["scheduler"] = "";
    Status st = load_checkpoint(*ckpt, loaded);
    BOOST_REQUIRE_MESSAGE(st.is_ok(), st.to_string());
    for (std::size_t i = 0; i < loaded.tensors.size(); ++i) {
      BOOST_TEST(test::same_bytes(loaded.tensors[i].tensor, states[r].tensors[i].tensor),
                 loaded.tensors[i].desc.name << " on rank " << r);
    }
    BOOST_TEST(loaded.objects.at("scheduler") == R"({"step": 17})");
  }
}

BOOST_AUTO_TEST_CASE(load_reshards_to_another_layout) {
  TempDir dir;
  // Saved: a [6, 8] f32 tensor split in 3 row blocks over 3 ranks.
  Tensor full = test::random_tensor(DType::f32, Shape{6, 8}, 5);
  std::vector<StateDict> states(3);
  for (int r = 0; r < 3; ++r) {
    Tensor block = *Tensor::empty(DType::f32, Shape{2, 8}, Device::host());
    std::copy_n(full.host_data<float>() + r * 16, 16, block.host_data<float>());
    states[static_cast<std::size_t>(r)].add("w", block, Shape{6, 8}, Shape{2 * r, 0});
  }
  BOOST_REQUIRE(save_states(dir.path(), 1, states).is_ok());
  std::string ckpt = dir / "global_step_1";

  // Loaded whole.
  StateDict whole;
  whole.add_full("w", test::zero_tensor(DType::f32, Shape{6, 8}));
  BOOST_REQUIRE(load_checkpoint(ckpt, whole).is_ok());
  BOOST_TEST(test::same_bytes(whole.tensors[0].tensor, full));

  // Loaded as column blocks [6, 3] at column 4 (crosses all three saved chunks).
  StateDict cols;
  cols.add("w", test::zero_tensor(DType::f32, Shape{6, 3}), Shape{6, 8}, Shape{0, 4});
  BOOST_REQUIRE(load_checkpoint(ckpt, cols).is_ok());
  for (int i = 0; i < 6; ++i) {
    for (int j = 0; j < 3; ++j) {
      // Compared as bits: random bytes include NaNs.
      BOOST_TEST(cols.tensors[0].tensor.host_data<std::uint32_t>()[i * 3 + j] ==
                 full.host_data<std::uint32_t>()[i * 8 + 4 + j]);
    }
  }
}

BOOST_AUTO_TEST_CASE(mismatches_are_named) {
  TempDir dir;
  auto states = every_dtype_state();
  BOOST_REQUIRE(save_states(dir.path(), 1, states).is_ok());
  std::string ckpt = dir / "global_step_1";
  StateDict no_object;
  no_object.objects["optimizer_step"] = "1";
  BOOST_TEST(load_checkpoint(ckpt, no_object).message().find("object 'optimizer_step'") != std::string::npos);
  StateDict missing;
  missing.add_full("nope", test::zero_tensor(DType::f32, Shape{2}));
  BOOST_TEST(load_checkpoint(ckpt, missing).message().find("'nope'") != std::string::npos);
  StateDict wrong_dtype;
  wrong_dtype.add("w_F32", test::zero_tensor(DType::f16, Shape{5, 3}), Shape{10, 3}, Shape{0, 0});
  BOOST_TEST(load_checkpoint(ckpt, wrong_dtype).message().find("saved as F32") != std::string::npos);
  StateDict wrong_shape;
  wrong_shape.add("w_F32", test::zero_tensor(DType::f32, Shape{5, 3}), Shape{11, 3}, Shape{0, 0});
  BOOST_TEST(load_checkpoint(ckpt, wrong_shape).message().find("global shape") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(corruption_is_caught_and_live_state_untouched) {
  for (std::string damage : {"flip", "truncate", "remove", "metadata"}) {
    BOOST_TEST_CONTEXT(damage) {
      TempDir dir;
      auto states = every_dtype_state();
      BOOST_REQUIRE(save_states(dir.path(), 1, states, 1).is_ok());
      std::string ckpt = dir / "global_step_1";
      std::string file = ckpt + "/policy/__0_0.safetensors";
      auto metadata = *read_checkpoint_metadata(ckpt);
      const ChunkMeta& chunk = metadata.tensors.at("w_I32").chunks[0];
      BOOST_REQUIRE(chunk.file == "__0_0.safetensors");
      if (damage == "flip") flip_byte(file, chunk.begin + 3);
      if (damage == "truncate") std::filesystem::resize_file(file, chunk.begin + 2);
      if (damage == "remove") std::filesystem::remove(file);
      if (damage == "metadata") std::filesystem::resize_file(ckpt + "/policy/metadata.json", 100);

      StateDict live = test::zeroed_like(states[0]);
      for (auto& t : live.tensors) std::fill_n(t.tensor.host_data<std::uint8_t>(), t.tensor.nbytes(), 0x5a);
      Status st = load_checkpoint(ckpt, live);
      BOOST_TEST(!st.is_ok());
      if (damage == "metadata") {
        BOOST_TEST(st.message().find("metadata.json") != std::string::npos, st.message());
      } else {
        BOOST_TEST(st.message().find("__0_0.safetensors") != std::string::npos, st.message());
        BOOST_TEST(st.message().find("tensor '") != std::string::npos, st.message());
      }
      if (damage == "flip") BOOST_TEST(st.message().find("checksum mismatch") != std::string::npos);
      for (const auto& t : live.tensors) {
        const auto* bytes = static_cast<const std::uint8_t*>(t.tensor.data());
        BOOST_TEST(std::all_of(bytes, bytes + t.tensor.nbytes(), [](std::uint8_t b) { return b == 0x5a; }));
      }
      auto verified = verify_checkpoint(ckpt);
      BOOST_TEST((!verified.is_ok() || !verified->ok()));
    }
  }
}

BOOST_AUTO_TEST_CASE(a_newer_format_version_is_refused) {
  TempDir dir;
  auto states = every_dtype_state();
  BOOST_REQUIRE(save_states(dir.path(), 1, states).is_ok());
  std::string meta = dir / "global_step_1/policy/metadata.json";
  std::string text = test::read_file(meta);
  auto pos = text.find("\"version\": 1");
  BOOST_REQUIRE(pos != std::string::npos);
  text.replace(pos, 12, "\"version\": 9");
  std::ofstream(meta) << text;
  auto m = read_checkpoint_metadata(dir / "global_step_1");
  BOOST_TEST(m.status().message().find("version 9") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(synthetic_state_round_trips) {
  TempDir dir;
  SyntheticStateSpec spec{2, 1u << 20, 13, 77};
  std::vector<StateDict> states;
  for (int r = 0; r < 2; ++r) states.push_back(*make_synthetic_state(spec, r, Device::host()));
  BOOST_REQUIRE(save_states(dir.path(), 2, states, 3).is_ok());
  for (std::size_t r = 0; r < 2; ++r) {
    StateDict loaded = test::zeroed_like(states[r]);
    BOOST_REQUIRE(load_checkpoint(dir / "global_step_2", loaded).is_ok());
    for (std::size_t i = 0; i < loaded.tensors.size(); ++i) {
      BOOST_TEST(test::same_bytes(loaded.tensors[i].tensor, states[r].tensors[i].tensor));
    }
  }
  BOOST_TEST(verify_checkpoint(dir / "global_step_2")->ok());
}

BOOST_AUTO_TEST_CASE(round_trip_on_the_default_device) {
  // On a machine with a GPU this is the CUDA path: pinned staging, device-to-host copies on save,
  // host-to-device on load. Without one it runs on host memory.
  TempDir dir;
  SyntheticStateSpec spec{2, 4u << 20, 12, 21};
  std::vector<StateDict> states;
  for (int r = 0; r < 2; ++r) states.push_back(*make_synthetic_state(spec, r, default_device(r)));
  BOOST_TEST_MESSAGE("state on " << states[0].tensors[0].tensor.device().to_string());
  BOOST_REQUIRE(save_states(dir.path(), 1, states, 3).is_ok());
  BOOST_TEST(verify_checkpoint(dir / "global_step_1")->ok());
  for (std::size_t r = 0; r < 2; ++r) {
    StateDict loaded;
    for (const auto& t : states[r].tensors) {
      loaded.tensors.push_back({t.desc, *Tensor::empty(t.desc.dtype, t.desc.local_shape, t.tensor.device())});
    }
    Status st = load_checkpoint(dir / "global_step_1", loaded);
    BOOST_REQUIRE_MESSAGE(st.is_ok(), st.to_string());
    for (std::size_t i = 0; i < loaded.tensors.size(); ++i) {
      std::vector<std::uint8_t> a(loaded.tensors[i].tensor.nbytes());
      std::vector<std::uint8_t> b(a.size());
      BOOST_REQUIRE(loaded.tensors[i].tensor.copy_to_host(a.data()).is_ok());
      BOOST_REQUIRE(states[r].tensors[i].tensor.copy_to_host(b.data()).is_ok());
      BOOST_TEST((a == b));
    }
  }
  // Files are the same whatever memory the state lived in.
  std::vector<StateDict> host_states;
  for (int r = 0; r < 2; ++r) host_states.push_back(*make_synthetic_state(spec, r, Device::host()));
  TempDir host_dir;
  BOOST_REQUIRE(save_states(host_dir.path(), 1, host_states, 3).is_ok());
  for (const auto& e : std::filesystem::directory_iterator(host_dir / "global_step_1/policy")) {
    std::string name = e.path().filename().string();
    BOOST_TEST((test::read_file(e.path().string()) == test::read_file(dir / ("global_step_1/policy/" + name))), name);
  }
}

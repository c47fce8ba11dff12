#define BOOST_TEST_MODULE load
#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>

#include "bench/synthetic_state.hpp"
#include "tests/checkpoint_test_util.hpp"
#include "stagehand/checkpoint/save/in_process_save.hpp"
#include "stagehand/checkpoint/load/loader.hpp"
#include "stagehand/checkpoint/load/checkpoint_reader.hpp"
#include "stagehand/checkpoint/load/load_plan.hpp"
#include "stagehand/checkpoint/load/resolve.hpp"
#include "stagehand/checkpoint/load/verify.hpp"
#include "stagehand/storage/default_file_system.hpp"
#include "stagehand/core/device.hpp"
#include "tests/metadata_edit.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;
using stagehand::test::TempDir;
using stagehand::test::edit_metadata;

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

/// The metadata.json text of a checkpoint of every_dtype_state().
std::string every_dtype_metadata_text() {
  TempDir dir;
  auto states = every_dtype_state();
  BOOST_REQUIRE(save_states(dir.path(), 1, states).is_ok());
  return test::read_file(dir / "global_step_1/policy/metadata.json");
}

/// `text` with the first match of `pattern` replaced by `replacement` ($1 for its group).
std::string replace_first(const std::string& text, const std::string& pattern,
                          const std::string& replacement) {
  std::string out = std::regex_replace(text, std::regex(pattern), replacement,
                                       std::regex_constants::format_first_only);
  BOOST_REQUIRE_MESSAGE(out != text, "no match for " << pattern);
  return out;
}

void fill_bytes(StateDict& state, std::uint8_t value) {
  for (auto& t : state.tensors) {
    std::fill_n(t.tensor.host_data<std::uint8_t>(), t.tensor.nbytes(), value);
  }
}

bool all_bytes_are(const StateDict& state, std::uint8_t value) {
  return std::all_of(state.tensors.begin(), state.tensors.end(), [&](const ShardedTensor& t) {
    const auto* bytes = static_cast<const std::uint8_t*>(t.tensor.data());
    return std::all_of(bytes, bytes + t.tensor.nbytes(),
                       [&](std::uint8_t b) { return b == value; });
  });
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

BOOST_AUTO_TEST_CASE(corruption_is_caught_and_live_state_untouched_when_found_before_reading) {
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
      // Found before any read: the state is untouched. A checksum mismatch is found after the
      // bytes were read (into the tensors): the state is then unspecified (load_checkpoint).
      if (damage != "flip") {
        for (const auto& t : live.tensors) {
          const auto* bytes = static_cast<const std::uint8_t*>(t.tensor.data());
          BOOST_TEST(std::all_of(bytes, bytes + t.tensor.nbytes(), [](std::uint8_t b) { return b == 0x5a; }));
        }
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

BOOST_AUTO_TEST_CASE(resharded_load_refuses_chunks_that_do_not_tile_the_tensor) {
  // Saved: a [4, 1024] f32 tensor in two column blocks at [0, 0] and [0, 512]; loaded as two row
  // blocks, so that each live block takes half of each saved chunk.
  for (std::string damage : {"shift", "swap", "dtype"}) {
    BOOST_TEST_CONTEXT(damage) {
      TempDir dir;
      Tensor full = test::random_tensor(DType::f32, Shape{4, 1024}, 8);
      std::vector<StateDict> states(2);
      for (int r = 0; r < 2; ++r) {
        Tensor block = *Tensor::empty(DType::f32, Shape{4, 512}, Device::host());
        for (int i = 0; i < 4; ++i) {
          std::copy_n(full.host_data<float>() + i * 1024 + r * 512, 512,
                      block.host_data<float>() + i * 512);
        }
        states[static_cast<std::size_t>(r)].add("w", block, Shape{4, 1024}, Shape{0, 512 * r});
      }
      BOOST_REQUIRE(save_states(dir.path(), 1, states).is_ok());
      std::string ckpt = dir / "global_step_1";
      edit_metadata(ckpt, [&](CheckpointMetadata& m) {
        TensorMeta& w = m.tensors.at("w");
        BOOST_REQUIRE(w.chunks.size() == 2u);
        // [0, 500]: the chunks overlap on 12 columns and leave the last 12 uncovered, while the
        // counted overlap still equals each live block's size.
        if (damage == "shift") w.chunks[1].offsets = Shape{0, 500};
        // Each chunk now claims the other's place: exact coverage, but the files disagree.
        if (damage == "swap") std::swap(w.chunks[0].offsets, w.chunks[1].offsets);
        // Same element size, so only the files' headers can tell.
        if (damage == "dtype") w.dtype = DType::i32;
      });
      for (int r = 0; r < 2; ++r) {
        StateDict rows;
        rows.add("w",
                 test::zero_tensor(damage == "dtype" ? DType::i32 : DType::f32, Shape{2, 1024}),
                 Shape{4, 1024}, Shape{2 * r, 0});
        fill_bytes(rows, 0x5a);
        Status st = load_checkpoint(ckpt, rows);
        BOOST_TEST(!st.is_ok(), "rank " << r);
        BOOST_TEST(st.message().find("tensor 'w'") != std::string::npos, st.message());
        BOOST_TEST(all_bytes_are(rows, 0x5a));
      }
      auto verified = verify_checkpoint(ckpt);
      BOOST_REQUIRE(verified.is_ok());
      BOOST_TEST(!verified->ok());
    }
  }
}

BOOST_AUTO_TEST_CASE(numbers_of_the_wrong_kind_or_range_are_refused) {
  const std::string text = every_dtype_metadata_text();
  BOOST_REQUIRE(metadata_from_json(text, "m.json").is_ok());
  struct Edit {
    std::string pattern;
    std::string replacement;
    std::string named;
  };
  const Edit edits[] = {
      // 2^40 + 1 once read as an int became 1.
      {R"("version": 1)", R"("version": 1099511627777)", "version"},
      {R"("version": 1)", R"("version": 1.0)", "version"},
      {R"("step": 1)", R"("step": 1.5)", "step"},
      {R"("step": 1)", R"("step": -1)", "step"},
      {R"("size": (\d+))", R"("size": $1.0)", "size"},
      // Beyond every integer type: converting it was undefined behaviour.
      {R"("size": (\d+))", R"("size": 1e30)", "size"},
      {R"("byte_range": \[\s*(\d+))", R"("byte_range": [ $1.0)", "byte_range"},
      {R"("byte_range": \[\s*(\d+))", R"("byte_range": [ 1e300)", "byte_range"},
      {R"("offsets": \[\s*(\d+))", R"("offsets": [ 9223372036854775808)", "offsets"},
      {R"("shape": \[\s*(\d+))", R"("shape": [ 5.0)", "shape"},
  };
  for (const auto& edit : edits) {
    BOOST_TEST_CONTEXT(edit.replacement) {
      auto m = metadata_from_json(replace_first(text, edit.pattern, edit.replacement), "m.json");
      BOOST_TEST(m.status().code() == ErrorCode::corruption);
      BOOST_TEST(m.status().message().find("'m.json'") != std::string::npos, m.status().message());
      BOOST_TEST(m.status().message().find(edit.named) != std::string::npos, m.status().message());
    }
  }
}

BOOST_AUTO_TEST_CASE(sizes_that_overflow_or_exceed_their_file_are_refused) {
  constexpr std::int64_t k2to32 = std::int64_t{1} << 32;
  constexpr std::int64_t k2to62 = std::int64_t{1} << 62;
  for (std::string damage : {"numel", "file", "rank"}) {
    BOOST_TEST_CONTEXT(damage) {
      TempDir dir;
      auto states = every_dtype_state();
      BOOST_REQUIRE(save_states(dir.path(), 1, states).is_ok());
      std::string ckpt = dir / "global_step_1";
      std::string file;
      edit_metadata(ckpt, [&](CheckpointMetadata& m) {
        file = m.files.begin()->first;
        TensorMeta big{DType::u8, {}, {}};
        ChunkMeta chunk{{}, {}, file, 4096, 4096, 0};
        if (damage == "numel") {
          // 2^64 elements: a product that wrapped to 0 matched an empty byte range.
          big.global_shape = chunk.shape = Shape{k2to32, k2to32};
          chunk.offsets = Shape{0, 0};
        } else if (damage == "file") {
          // Consistent with its dtype, but far beyond its file: reading it allocated 2^62 bytes.
          big.global_shape = chunk.shape = Shape{k2to62};
          chunk.offsets = Shape{0};
          chunk.end = 4096 + static_cast<std::uint64_t>(k2to62);
        } else {
          big.global_shape = Shape{4, 4};
          chunk.shape = Shape{16};
          chunk.offsets = Shape{0, 0};
          chunk.end = 4096 + 16;
        }
        big.chunks.push_back(chunk);
        m.tensors["big"] = big;
      });
      auto m = read_checkpoint_metadata(ckpt);
      BOOST_TEST(!m.is_ok());
      BOOST_TEST(m.status().message().find("metadata.json") != std::string::npos,
                 m.status().message());
      BOOST_TEST(m.status().message().find("'big'") != std::string::npos, m.status().message());
      if (damage == "file")
        BOOST_TEST(m.status().message().find(file) != std::string::npos, m.status().message());

      StateDict live;
      Shape local = damage == "numel" ? Shape{1, 16} : damage == "file" ? Shape{16} : Shape{4, 4};
      Shape global = damage == "numel"  ? Shape{k2to32, k2to32}
                     : damage == "file" ? Shape{k2to62}
                                        : Shape{4, 4};
      live.add("big", test::zero_tensor(DType::u8, local), global, Shape::zeros(local.rank()));
      fill_bytes(live, 0x5a);
      Status st = load_checkpoint(ckpt, live);
      BOOST_TEST(!st.is_ok());
      BOOST_TEST(st.message().find("'big'") != std::string::npos, st.message());
      BOOST_TEST(all_bytes_are(live, 0x5a));
    }
  }
}

namespace {

/// The live block `desc` of a 2-D tensor filled element by element from the saved blocks
/// (replica 0) of `saved`: what a load must give, computed without the loader.
std::vector<std::uint8_t> expected_block(const std::vector<StateDict>& saved, const ShardedTensorDesc& desc) {
  const std::size_t elem = dtype_size(desc.dtype);
  std::vector<std::uint8_t> out(desc.nbytes());
  for (std::int64_t i = 0; i < desc.local_shape[0]; ++i) {
    for (std::int64_t j = 0; j < desc.local_shape[1]; ++j) {
      const std::int64_t gi = desc.global_offset[0] + i;
      const std::int64_t gj = desc.global_offset[1] + j;
      for (const auto& state : saved) {
        for (const auto& t : state.tensors) {
          const ShardedTensorDesc& d = t.desc;
          if (d.name != desc.name || d.replica_id != 0 || gi < d.global_offset[0] ||
              gi >= d.global_offset[0] + d.local_shape[0] || gj < d.global_offset[1] ||
              gj >= d.global_offset[1] + d.local_shape[1]) {
            continue;
          }
          const auto at = static_cast<std::size_t>((gi - d.global_offset[0]) * d.local_shape[1] + gj - d.global_offset[1]);
          std::copy_n(static_cast<const std::uint8_t*>(t.tensor.data()) + at * elem, elem,
                      out.data() + static_cast<std::size_t>(i * desc.local_shape[1] + j) * elem);
        }
      }
    }
  }
  return out;
}

/// Every tensor of `saved` (2-D) as block `part` of `parts` of a layout: "whole", "rows" (split
/// in `parts` along dimension 0, not the saved split), "cols" (along dimension 1) or "shifted"
/// (rows 1 .. n-1, crossing every saved chunk's edge).
StateDict live_layout(const std::vector<StateDict>& saved, const std::string& layout, int part, int parts) {
  StateDict live;
  for (const auto& t : saved[0].tensors) {
    const Shape& g = t.desc.global_shape;
    Shape offset{0, 0};
    Shape shape = g;
    if (layout == "rows") {
      offset = Shape{g[0] * part / parts, 0};
      shape = Shape{g[0] * (part + 1) / parts - offset[0], g[1]};
    } else if (layout == "cols") {
      offset = Shape{0, g[1] * part / parts};
      shape = Shape{g[0], g[1] * (part + 1) / parts - offset[1]};
    } else if (layout == "shifted") {
      offset = Shape{1, 0};
      shape = Shape{g[0] - 2, g[1]};
    }
    live.add(t.desc.name, test::zero_tensor(t.desc.dtype, shape), g, offset);
  }
  return live;
}

/// A synthetic state of `ranks` ranks saved as step 1 under `root`.
std::vector<StateDict> save_synthetic(const std::string& root, int ranks, std::uint64_t bytes_per_rank, int tensors,
                                      int threads) {
  std::vector<StateDict> states;
  for (int r = 0; r < ranks; ++r) {
    states.push_back(*make_synthetic_state({ranks, bytes_per_rank, tensors, 7}, r, Device::host()));
  }
  BOOST_REQUIRE(save_states(root, 1, states, threads).is_ok());
  return states;
}

}  // namespace

BOOST_AUTO_TEST_CASE(coalesce_ranges_merges_neighbours_only) {
  // Given out of order: a.0-10, a.10-30 touch; a.31-40 leaves a gap; b.30-40 is another file.
  const std::vector<ReadRange> ranges = {
      {"a", 10, 30}, {"b", 30, 40}, {"a", 0, 10}, {"a", 31, 40}, {"b", 40, 50}, {"a", 40, 100}};
  using Reads = std::vector<std::vector<std::size_t>>;
  BOOST_TEST((coalesce_ranges(ranges, 1000) == Reads{{2, 0}, {3, 5}, {1, 4}}));
  // At most 30 bytes a read: a.31-40 and a.40-100 (69 bytes) stay apart; a range above the
  // limit is a read of its own.
  BOOST_TEST((coalesce_ranges(ranges, 30) == Reads{{2, 0}, {3}, {5}, {1, 4}}));
  BOOST_TEST((coalesce_ranges({}, 30).empty()));
}

BOOST_AUTO_TEST_CASE(neighbouring_chunks_are_read_in_one_read) {
  TempDir dir;
  // One bucket file: every chunk of the rank lies back to back in it, as many bytes as one read
  // from a local file system takes.
  auto states = save_synthetic(dir.path(), 1, kCheapReadBytes, 8, 1);
  std::string ckpt = dir / "global_step_1";
  for (int threads : {1, 4}) {
    BOOST_TEST_CONTEXT("threads " << threads) {
      StateDict live = test::zeroed_like(states[0]);
      LoadOptions options;
      options.thread_count = threads;
      LoadReport report;
      Status st = load_checkpoint(*local_file_system(), ckpt, live, options, &report);
      BOOST_REQUIRE_MESSAGE(st.is_ok(), st.to_string());
      BOOST_TEST(report.chunks == 8u);
      BOOST_TEST(report.direct_chunks == 8u);  // same shapes: straight into the tensors
      BOOST_TEST(report.reads == 1u);
      BOOST_TEST(report.buffer_peak_bytes == 0u);
      std::uint64_t state_bytes = 0;
      for (std::size_t i = 0; i < live.tensors.size(); ++i) {
        BOOST_TEST(test::same_bytes(live.tensors[i].tensor, states[0].tensors[i].tensor), live.tensors[i].desc.name);
        state_bytes += live.tensors[i].tensor.nbytes();
      }
      BOOST_TEST(report.bytes == state_bytes);
      // Reads of at most 64 KiB: more reads, same bytes.
      options.max_read_bytes = 64u << 10;
      StateDict again = test::zeroed_like(states[0]);
      BOOST_REQUIRE(load_checkpoint(*local_file_system(), ckpt, again, options, &report).is_ok());
      BOOST_TEST(report.reads >= state_bytes / options.max_read_bytes);
      for (std::size_t i = 0; i < again.tensors.size(); ++i) {
        BOOST_TEST(test::same_bytes(again.tensors[i].tensor, states[0].tensors[i].tensor));
      }
    }
  }
}

namespace {

/// The local file system, saying its reads are requests (as an object store's are).
class CostlyReads final : public FileSystemWrapper {
 public:
  CostlyReads() : FileSystemWrapper(local_file_system()) {}
  FileSystemCapabilities capabilities(const std::string& path) const override {
    FileSystemCapabilities c = inner().capabilities(path);
    c.cheap_reads = false;
    return c;
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(cheap_reads_come_in_cache_sized_pieces_and_requests_as_large_as_allowed) {
  TempDir dir;
  // One bucket file of 8 chunks, 6 MiB in all.
  auto saved = save_synthetic(dir.path(), 1, 6u << 20, 8, 1);
  const std::string ckpt = dir / "global_step_1";
  BOOST_REQUIRE(local_file_system()->capabilities(ckpt).cheap_reads);
  CostlyReads costly;
  BOOST_REQUIRE(!costly.capabilities(ckpt).cheap_reads);
  // "whole": every chunk straight into its tensor; "rows": resharded, through the buffers.
  for (std::string layout : {"whole", "rows"}) {
    for (int threads : {1, 4}) {
      BOOST_TEST_CONTEXT(layout << ", " << threads << " threads") {
        std::vector<StateDict> loaded;
        for (bool cheap : {true, false}) {
          StateDict live = live_layout(saved, layout, 0, layout == "whole" ? 1 : 3);
          LoadOptions options;
          options.thread_count = threads;
          LoadReport report;
          Status st = load_checkpoint(cheap ? *local_file_system() : costly, ckpt, live, options, &report);
          BOOST_REQUIRE_MESSAGE(st.is_ok(), st.to_string());
          BOOST_TEST(report.direct_chunks == (layout == "whole" ? 8u : 0u));
          BOOST_TEST(report.bytes > (5u << 20));  // more than a few cheap reads' worth
          // Reads as large as allowed: at most one short read per task (a task holds at most
          // max_read_bytes, and there are no more tasks than chunks).
          const std::uint64_t most = cheap ? kCheapReadBytes : options.max_read_bytes;
          BOOST_TEST_MESSAGE("cheap " << cheap << ": " << report.reads << " reads of " << report.bytes << " bytes");
          BOOST_TEST(report.reads >= (report.bytes + most - 1) / most);
          BOOST_TEST(report.reads <= report.bytes / most + report.chunks);
          loaded.push_back(std::move(live));
        }
        for (std::size_t i = 0; i < loaded[0].tensors.size(); ++i) {
          BOOST_TEST(test::same_bytes(loaded[0].tensors[i].tensor, loaded[1].tensors[i].tensor));
          if (layout == "whole") {
            BOOST_TEST(test::same_bytes(loaded[0].tensors[i].tensor, saved[0].tensors[i].tensor));
          }
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(parallel_resharded_load_equals_serial_load_byte_for_byte) {
  TempDir dir;
  // Saved by 2 ranks (rows split in 2, every fourth tensor replicated), 2 buckets each.
  auto saved = save_synthetic(dir.path(), 2, 256u << 10, 8, 2);
  std::string ckpt = dir / "global_step_1";
  for (std::string layout : {"whole", "rows", "cols", "shifted"}) {
    const int parts = layout == "whole" || layout == "shifted" ? 1 : 3;
    for (int part = 0; part < parts; ++part) {
      LoadOptions serial;
      serial.thread_count = 1;
      StateDict reference = live_layout(saved, layout, part, parts);
      BOOST_REQUIRE(load_checkpoint(*local_file_system(), ckpt, reference, serial).is_ok());
      for (int threads : {2, 8}) {
        for (std::size_t buffer : {std::size_t{4096}, std::size_t{16} << 20}) {
          BOOST_TEST_CONTEXT(layout << " part " << part << ", " << threads << " threads, buffer " << buffer) {
            LoadOptions options;
            options.thread_count = threads;
            options.buffer_bytes = buffer;
            options.max_read_bytes = 8192;  // many small reads, so that every thread has some
            StateDict live = live_layout(saved, layout, part, parts);
            LoadReport report;
            Status st = load_checkpoint(*local_file_system(), ckpt, live, options, &report);
            BOOST_REQUIRE_MESSAGE(st.is_ok(), st.to_string());
            BOOST_TEST(report.thread_count == threads);
            if (layout != "whole") BOOST_TEST(report.direct_chunks < report.chunks);
            if (layout != "whole") BOOST_TEST(report.buffer_peak_bytes <= static_cast<std::uint64_t>(threads) * buffer);
            for (std::size_t i = 0; i < live.tensors.size(); ++i) {
              const Tensor& t = live.tensors[i].tensor;
              BOOST_TEST(test::same_bytes(t, reference.tensors[i].tensor), live.tensors[i].desc.name);
              const auto expected = expected_block(saved, live.tensors[i].desc);
              const auto* bytes = static_cast<const std::uint8_t*>(t.data());
              BOOST_TEST(std::equal(bytes, bytes + t.nbytes(), expected.begin(), expected.end()),
                         live.tensors[i].desc.name);
            }
          }
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_corrupted_chunk_is_refused_on_many_threads) {
  for (std::string layout : {"whole", "cols"}) {
    for (int threads : {1, 4}) {
      BOOST_TEST_CONTEXT(layout << ", " << threads << " threads") {
        TempDir dir;
        auto saved = save_synthetic(dir.path(), 2, 256u << 10, 8, 2);
        std::string ckpt = dir / "global_step_1";
        auto metadata = *read_checkpoint_metadata(ckpt);
        // The last chunk of the last tensor: read last by a serial load, by any thread otherwise.
        const auto& [name, tensor] = *metadata.tensors.rbegin();
        const ChunkMeta& chunk = tensor.chunks.back();
        flip_byte(ckpt + "/policy/" + chunk.file, chunk.end - 1);
        LoadOptions options;
        options.thread_count = threads;
        options.buffer_bytes = 4096;
        options.max_read_bytes = 8192;
        StateDict live = live_layout(saved, layout, 1, layout == "whole" ? 1 : 2);
        if (layout == "whole") live = live_layout(saved, layout, 0, 1);
        Status st = load_checkpoint(*local_file_system(), ckpt, live, options);
        BOOST_TEST(!st.is_ok());
        BOOST_TEST(st.message().find("checksum mismatch") != std::string::npos, st.message());
        BOOST_TEST(st.message().find("tensor '" + name + "'") != std::string::npos, st.message());
        BOOST_TEST(st.message().find(chunk.file) != std::string::npos, st.message());
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(buffered_pieces_end_on_element_boundaries) {
  // Chunks of odd byte sizes back to back in one file, read through buffers of odd sizes: a
  // piece must not end inside an element.
  TempDir dir;
  std::vector<StateDict> saved(2);
  std::uint32_t seed = 11;
  const DType dtypes[] = {DType::u8, DType::f16, DType::f32, DType::i64, DType::u8};
  for (std::size_t i = 0; i < std::size(dtypes); ++i) {
    for (int r = 0; r < 2; ++r) {
      saved[static_cast<std::size_t>(r)].add("t" + std::to_string(i), test::random_tensor(dtypes[i], Shape{97, 7}, seed++),
                                             Shape{194, 7}, Shape{97 * r, 0});
    }
  }
  BOOST_REQUIRE(save_states(dir.path(), 1, saved, 1).is_ok());
  for (std::size_t buffer : {4096, 4097, 4099, 5001}) {
    const int threads = buffer == 4096 ? 1 : 3;
    BOOST_TEST_CONTEXT(threads << " threads, buffer " << buffer) {
      LoadOptions options;
      options.thread_count = threads;
      options.buffer_bytes = buffer;
      StateDict live = live_layout(saved, "cols", 1, 3);
      Status st = load_checkpoint(*local_file_system(), dir / "global_step_1", live, options);
      BOOST_REQUIRE_MESSAGE(st.is_ok(), st.to_string());
      for (const auto& t : live.tensors) {
        const auto expected = expected_block(saved, t.desc);
        const auto* bytes = static_cast<const std::uint8_t*>(t.tensor.data());
        BOOST_TEST(std::equal(bytes, bytes + t.tensor.nbytes(), expected.begin(), expected.end()), t.desc.name);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_chunk_read_in_many_reads_is_copied_whole_into_its_other_blocks) {
  // Each saved chunk fills three live blocks: one it is read straight into, the same tensor in
  // another layout under another name, and (for the f16 tensor) an f32 copy. The other blocks
  // take their copies read by read, and reads of odd sizes cut elements: each copy must take
  // whole elements only, and every block end up whole.
  TempDir dir;
  std::vector<StateDict> saved(2);
  std::uint32_t seed = 21;
  const DType dtypes[] = {DType::u8, DType::f16, DType::f32, DType::i64};
  for (std::size_t i = 0; i < std::size(dtypes); ++i) {
    for (int r = 0; r < 2; ++r) {
      saved[static_cast<std::size_t>(r)].add("t" + std::to_string(i), test::random_tensor(dtypes[i], Shape{97, 7}, seed++),
                                             Shape{194, 7}, Shape{97 * r, 0});
    }
  }
  BOOST_REQUIRE(save_states(dir.path(), 1, saved, 1).is_ok());
  for (std::uint64_t read : {std::uint64_t{999}, std::uint64_t{1000}, std::uint64_t{4099}, kCheapReadBytes}) {
    for (int threads : {1, 3}) {
      BOOST_TEST_CONTEXT(threads << " threads, reads of " << read << " bytes") {
        StateDict live = live_layout(saved, "whole", 0, 1);
        LoadOptions options;
        options.thread_count = threads;
        options.max_read_bytes = read;
        options.convert_dtypes = true;
        for (const auto& t : live_layout(saved, "cols", 1, 3).tensors) {
          live.add("cols." + t.desc.name, t.tensor, t.desc.global_shape, t.desc.global_offset);
          options.sources["cols." + t.desc.name] = t.desc.name;
        }
        live.add_full("f32.t1", test::zero_tensor(DType::f32, Shape{194, 7}));
        options.sources["f32.t1"] = "t1";
        fill_bytes(live, 0x5a);  // bytes not yet read are not zeros, which the saved ones may be
        LoadReport report;
        Status st = load_checkpoint(*local_file_system(), dir / "global_step_1", live, options, &report);
        BOOST_REQUIRE_MESSAGE(st.is_ok(), st.to_string());
        // 8 saved chunks, each read once, in more reads than chunks.
        BOOST_TEST(report.chunks == 8u);
        BOOST_TEST(report.direct_chunks == 8u);
        if (read <= 1000) BOOST_TEST(report.reads > 8u);
        for (const auto& t : live.tensors) {
          ShardedTensorDesc desc = t.desc;
          if (desc.name.rfind("cols.", 0) == 0) desc.name = desc.name.substr(5);
          if (desc.name == "f32.t1") {
            desc.name = "t1";
            desc.dtype = DType::f16;
          }
          auto expected = expected_block(saved, desc);
          if (t.desc.dtype != desc.dtype) {
            std::vector<std::uint8_t> converted(t.tensor.nbytes());
            BOOST_REQUIRE(convert_elements(expected.data(), desc.dtype, converted.data(), t.desc.dtype,
                                           static_cast<std::size_t>(t.desc.local_shape.numel()))
                              .is_ok());
            expected = std::move(converted);
          }
          const auto* bytes = static_cast<const std::uint8_t*>(t.tensor.data());
          BOOST_TEST(std::equal(bytes, bytes + t.tensor.nbytes(), expected.begin(), expected.end()), t.desc.name);
        }
      }
    }
  }
}

// -- what a load fills: selections, conversions, safetensors folders --

namespace {

Tensor f32_tensor(const Shape& shape, const std::vector<float>& values) {
  Tensor t = *Tensor::empty(DType::f32, shape, Device::host());
  std::copy(values.begin(), values.end(), t.host_data<float>());
  return t;
}

Tensor bf16_tensor(const Shape& shape, const std::vector<std::uint16_t>& bits) {
  Tensor t = *Tensor::empty(DType::bf16, shape, Device::host());
  std::copy(bits.begin(), bits.end(), t.host_data<std::uint16_t>());
  return t;
}

/// A checkpoint of a model's weights (bf16, split over two ranks by rows), its optimizer's f32
/// master copy, a scheduler and two ranks' RNG.
std::string save_model_like(const TempDir& dir) {
  std::vector<StateDict> states(2);
  // bf16 bits of 1, 2, -0.5, 3.5 and 0.25, 1.5, -8, 0.
  const std::vector<std::uint16_t> bits{0x3f80, 0x4000, 0xbf00, 0x4060, 0x3e80, 0x3fc0, 0xc100, 0x0000};
  for (int r = 0; r < 2; ++r) {
    StateDict& s = states[static_cast<std::size_t>(r)];
    const auto at = static_cast<std::ptrdiff_t>(4 * r);
    s.add("model.w", bf16_tensor(Shape{1, 4}, {bits.begin() + at, bits.begin() + at + 4}), Shape{2, 4}, Shape{r, 0});
    s.add("optimizer.main.model.w", f32_tensor(Shape{1, 4}, {9, 9, 9, 9}), Shape{2, 4}, Shape{r, 0});
    s.objects["rng.rank" + std::to_string(r)] = "rng of rank " + std::to_string(r);
    s.objects["scheduler"] = "scheduler";
  }
  BOOST_REQUIRE(save_states(dir.path(), 1, states).is_ok());
  return dir / "global_step_1";
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_selection_skips_fills_from_another_name_and_converts) {
  TempDir dir;
  const std::string ckpt = save_model_like(dir);
  StateDict live;
  live.add_full("model.w", bf16_tensor(Shape{2, 4}, std::vector<std::uint16_t>(8, 0x7777)));
  live.add_full("optimizer.main.model.w", f32_tensor(Shape{2, 4}, std::vector<float>(8, -1.0f)));
  live.objects["scheduler"] = "untouched";
  live.objects["rng.rank0"] = "untouched";

  // Without the optimizer: its tensor and the scheduler stay as they are.
  LoadOptions options = load_selection_by_name(live, LoadScope{false, true, true});
  BOOST_TEST(options.skip.count("optimizer.main.model.w") == 1u);
  BOOST_TEST(options.skip.count("scheduler") == 1u);
  BOOST_REQUIRE(load_checkpoint(*local_file_system(), ckpt, live, options).is_ok());
  BOOST_TEST(live.tensors[0].tensor.host_data<std::uint16_t>()[5] == 0x3fc0);
  BOOST_TEST(live.tensors[1].tensor.host_data<float>()[0] == -1.0f);
  BOOST_TEST(live.objects.at("scheduler") == "untouched");
  BOOST_TEST(live.objects.at("rng.rank0") == "rng of rank 0");

  // The master copy filled from the bf16 weights: exact, converted on the way.
  options.sources["optimizer.main.model.w"] = "model.w";
  options.skip.erase("optimizer.main.model.w");
  BOOST_REQUIRE(load_checkpoint(*local_file_system(), ckpt, live, options).is_ok());
  const std::vector<float> expected{1, 2, -0.5f, 3.5f, 0.25f, 1.5f, -8, 0};
  for (std::size_t i = 0; i < 8; ++i) BOOST_TEST(live.tensors[1].tensor.host_data<float>()[i] == expected[i]);

  // Without convert_dtypes another dtype is refused, naming both.
  options.convert_dtypes = false;
  Status refused = load_checkpoint(*local_file_system(), ckpt, live, options);
  BOOST_TEST(refused.message().find("saved as BF16, live as F32") != std::string::npos, refused.to_string());
  BOOST_TEST(refused.message().find("from saved tensor 'model.w'") != std::string::npos, refused.to_string());
}

BOOST_AUTO_TEST_CASE(missing_and_unused_names_are_errors_or_reported_as_asked) {
  TempDir dir;
  const std::string ckpt = save_model_like(dir);
  StateDict live;
  live.add_full("model.w", bf16_tensor(Shape{2, 4}, std::vector<std::uint16_t>(8, 0)));
  live.add_full("model.extra", f32_tensor(Shape{3}, {5, 5, 5}));
  live.objects["rng.rank7"] = "mine";
  LoadOptions options;

  // Strict: the tensor the checkpoint lacks is an error, and nothing was modified.
  Status missing = load_checkpoint(*local_file_system(), ckpt, live, options);
  BOOST_TEST(missing.message().find("tensor 'model.extra'") != std::string::npos, missing.to_string());
  BOOST_TEST(missing.message().find("not in the checkpoint") != std::string::npos, missing.to_string());
  BOOST_TEST(live.tensors[0].tensor.host_data<std::uint16_t>()[0] == 0);

  // An object the checkpoint lacks is an error too, unless it is optional.
  StateDict objects;
  objects.add_full("model.w", bf16_tensor(Shape{2, 4}, std::vector<std::uint16_t>(8, 0)));
  objects.objects["rng.rank7"] = "mine";
  Status object = load_checkpoint(*local_file_system(), ckpt, objects, options);
  BOOST_TEST(object.message().find("object 'rng.rank7' is not in") != std::string::npos, object.to_string());
  LoadOptions optional;
  optional.optional_objects.insert("rng.rank7");
  LoadReport optional_report;
  BOOST_REQUIRE(load_checkpoint(*local_file_system(), ckpt, objects, optional, &optional_report).is_ok());
  BOOST_TEST((optional_report.missing_objects == std::vector<std::string>{"rng.rank7"}));

  // Not strict: left as they are and reported.
  options.strict = false;
  LoadReport report;
  BOOST_REQUIRE(load_checkpoint(*local_file_system(), ckpt, live, options, &report).is_ok());
  BOOST_TEST((report.missing_tensors == std::vector<std::string>{"model.extra"}));
  BOOST_TEST((report.missing_objects == std::vector<std::string>{"rng.rank7"}));
  BOOST_TEST(live.tensors[1].tensor.host_data<float>()[2] == 5.0f);
  BOOST_TEST(live.objects.at("rng.rank7") == "mine");
  BOOST_TEST(live.tensors[0].tensor.host_data<std::uint16_t>()[1] == 0x4000);
  // The checkpoint's tensor this state does not have is reported, or refused when asked.
  BOOST_TEST((report.unused_tensors == std::vector<std::string>{"optimizer.main.model.w"}));
  options.refuse_unused = true;
  Status unused = load_checkpoint(*local_file_system(), ckpt, live, options);
  BOOST_TEST(unused.message().find("1 tensor(s) the state does not have: 'optimizer.main.model.w'") !=
                 std::string::npos,
             unused.to_string());
}

namespace {

/// Writes a safetensors file of whole f32 tensors with plain names, as a Hugging Face export does.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::vector<SafetensorsEntry> entries;
  std::uint64_t at = 0;
  for (const auto& [name, t] : tensors) {
    entries.push_back({name, t.dtype(), t.shape(), at, at + t.nbytes()});
    at += t.nbytes();
  }
  std::string bytes = make_safetensors_header(entries);
  for (const auto& [name, t] : tensors) bytes.append(static_cast<const char*>(t.data()), t.nbytes());
  std::ofstream(path, std::ios::binary) << bytes;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_safetensors_folder_loads_resharded_and_converted) {
  Tensor w = f32_tensor(Shape{2, 3}, {1, 2, 3, 1.00390625f, -1.01171875f, 7});
  Tensor b = f32_tensor(Shape{3}, {0.5f, 0.25f, -2});
  for (bool sharded : {false, true}) {
    BOOST_TEST_CONTEXT((sharded ? "two shards and an index" : "one model.safetensors")) {
      TempDir dir;
      if (sharded) {
        write_safetensors(dir / "model-00001-of-00002.safetensors", {{"model.w", w}});
        write_safetensors(dir / "model-00002-of-00002.safetensors", {{"model.b", b}});
        std::ofstream(dir / "model.safetensors.index.json")
            << R"({"metadata": {"total_size": 36}, "weight_map": {"model.w": "model-00001-of-00002.safetensors",
                  "model.b": "model-00002-of-00002.safetensors"}})";
      } else {
        write_safetensors(dir / "model.safetensors", {{"model.w", w}, {"model.b", b}});
      }
      BOOST_TEST(*is_safetensors_folder(*local_file_system(), dir.path()));
      BOOST_TEST(*resolve_checkpoint(dir.path()) == dir.path());
      // The second row only, as bf16: 1 + 2^-8 is a tie and rounds to even (1.0); -(1 + 3 x
      // 2^-8) rounds up in magnitude to -1.015625.
      StateDict live;
      live.add("model.w", bf16_tensor(Shape{1, 3}, {0, 0, 0}), Shape{2, 3}, Shape{1, 0});
      live.add_full("model.b", f32_tensor(Shape{3}, {0, 0, 0}));
      LoadOptions options;
      options.convert_dtypes = true;
      Status st = load_checkpoint(*local_file_system(), dir.path(), live, options);
      BOOST_REQUIRE_MESSAGE(st.is_ok(), st.to_string());
      const auto* row = live.tensors[0].tensor.host_data<std::uint16_t>();
      BOOST_TEST(row[0] == 0x3f80);
      BOOST_TEST(row[1] == 0xbf82);
      BOOST_TEST(row[2] == 0x40e0);
      BOOST_TEST(test::same_bytes(live.tensors[1].tensor, b));
    }
  }
}

BOOST_AUTO_TEST_CASE(a_safetensors_index_that_disagrees_with_its_files_is_refused) {
  Tensor w = f32_tensor(Shape{2}, {1, 2});
  TempDir dir;
  write_safetensors(dir / "a.safetensors", {{"w", w}});
  write_safetensors(dir / "b.safetensors", {{"v", w}});
  StateDict live;
  live.add_full("w", f32_tensor(Shape{2}, {0, 0}));
  auto refused = [&](const std::string& index) {
    std::ofstream(dir / "model.safetensors.index.json", std::ios::trunc) << index;
    return load_checkpoint(dir.path(), live).message();
  };
  BOOST_TEST(refused(R"({"weight_map": {"w": "b.safetensors", "v": "b.safetensors"}})").find("names tensor 'w' in 'b.safetensors'") !=
             std::string::npos);
  BOOST_TEST(refused(R"({"weight_map": {"w": "../a.safetensors"}})").find("is not the name of a file") != std::string::npos);
  BOOST_TEST(refused(R"({"weight_map": {"w": "a.safetensors", "v": "b.safetensors", "x": "b.safetensors"}})")
                 .find("names tensor 'x'") != std::string::npos);
  BOOST_TEST(refused(R"({"metadata": {}})").find("'weight_map' is missing") != std::string::npos);
  write_safetensors(dir / "b.safetensors", {{"w", w}});
  const std::string twice = refused(R"({"weight_map": {"w": "a.safetensors", "v": "b.safetensors"}})");
  BOOST_TEST(twice.find("puts tensor 'w' in 'a.safetensors', but it is in") != std::string::npos, twice);
  BOOST_TEST(live.tensors[0].tensor.host_data<float>()[0] == 0.0f);
}

BOOST_AUTO_TEST_CASE(a_load_that_is_not_strict_lets_missing_objects_pass_and_names_them) {
  TempDir dir;
  const std::string ckpt = save_model_like(dir);
  StateDict live;
  live.add_full("model.w", bf16_tensor(Shape{2, 4}, std::vector<std::uint16_t>(8, 0)));
  live.objects["optimizer.lr"] = "mine";
  LoadOptions options;
  options.strict = false;
  LoadReport report;
  BOOST_REQUIRE(load_checkpoint(*local_file_system(), ckpt, live, options, &report).is_ok());
  BOOST_TEST((report.missing_objects == std::vector<std::string>{"optimizer.lr"}));
  BOOST_TEST(live.objects.at("optimizer.lr") == "mine");
}

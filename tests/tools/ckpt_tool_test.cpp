#define BOOST_TEST_MODULE ckpt_tool
#include <boost/test/unit_test.hpp>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "bench/synthetic_state.hpp"
#include "tests/checkpoint_test_util.hpp"
#include "stagehand/checkpoint/interop/export.hpp"
#include "stagehand/checkpoint/load/loader.hpp"
#include "stagehand/checkpoint/load/checkpoint_reader.hpp"
#include "stagehand/checkpoint/load/load_plan.hpp"
#include "stagehand/checkpoint/load/resolve.hpp"
#include "stagehand/checkpoint/load/verify.hpp"
#include "stagehand/storage/default_file_system.hpp"
#include "stagehand/checkpoint/save/save_engine.hpp"
#include "stagehand/checkpoint/store/checkpoint_store.hpp"
#include "stagehand/checkpoint/tiers/tier_copy.hpp"
#include "tests/metadata_edit.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;
using stagehand::test::TempDir;
using stagehand::test::edit_metadata;

namespace {

/// Where the programs are; STAGEHAND_BIN_DIR in the environment overrides the build's folder
/// (the GPU check runs the tests from an unpacked copy).
const std::string kBin = test::bin_dir();

std::string bench_save(const std::string& out) {
  return kBin + "/stagehand-bench save --out " + out +
         " --ranks 2 --bytes-per-rank 1M --tensors 8 --thread-count 3 --staging-buckets 1";
}

/// Whether every rank of the state bench_save saved loads from `ckpt` (resolved as the tool does).
bool every_rank_loads(const std::string& ckpt) {
  auto dir = resolve_checkpoint(ckpt);
  if (!dir.is_ok()) return false;
  for (int rank = 0; rank < 2; ++rank) {
    auto saved = make_synthetic_state({2, 1u << 20, 8, 1}, rank, Device::host());
    BOOST_REQUIRE(saved.is_ok());
    StateDict loaded = test::zeroed_like(*saved);
    loaded.objects = saved->objects;
    if (!load_checkpoint(*dir, loaded).is_ok()) return false;
  }
  return true;
}

/// Replaces the first match of `pattern` in a file's text.
void edit_text(const std::string& path, const std::string& pattern,
               const std::string& replacement) {
  std::string text = test::read_file(path);
  std::string out = std::regex_replace(text, std::regex(pattern), replacement,
                                       std::regex_constants::format_first_only);
  BOOST_REQUIRE_MESSAGE(out != text, "no match for " << pattern << " in " << path);
  std::ofstream(path, std::ios::binary) << out;
}

/// Replaces the first match of `pattern` in the JSON header of a safetensors file, keeping the
/// header's length (its padding absorbs the difference), so that only the header changes.
void edit_safetensors_header(const std::string& path, const std::string& pattern,
                             const std::string& replacement) {
  std::string bytes = test::read_file(path);
  BOOST_REQUIRE(bytes.size() >= 8);
  std::uint64_t len = 0;
  for (int i = 7; i >= 0; --i)
    len = len << 8 | static_cast<std::uint8_t>(bytes[static_cast<std::size_t>(i)]);
  std::string header = bytes.substr(8, len);
  std::string edited = std::regex_replace(header, std::regex(pattern), replacement,
                                          std::regex_constants::format_first_only);
  BOOST_REQUIRE_MESSAGE(edited != header, "no match for " << pattern);
  while (edited.size() > len && edited.back() == ' ')
    edited.pop_back();
  BOOST_REQUIRE(edited.size() <= len);
  edited.append(len - edited.size(), ' ');
  bytes.replace(8, len, edited);
  std::ofstream(path, std::ios::binary) << bytes;
}

/// A tensor of the export fixture, whole, and how it is split over two ranks.
struct GlobalTensor {
  std::string name;
  Tensor full;
  /// The dimension split in two halves; -1: every rank holds all of it (replicated).
  int split_dim;
};

/// Every kind of tensor an export meets: model weights and optimizer state, row and column
/// splits, replicas, scalars, every dtype (FP8 and unsigned included).
std::vector<GlobalTensor> export_fixture() {
  std::vector<GlobalTensor> out;
  std::uint32_t seed = 7;
  auto add = [&](std::string name, DType dtype, Shape shape, int split_dim) {
    out.push_back({std::move(name), test::random_tensor(dtype, shape, seed++), split_dim});
  };
  add("model.embed.weight", DType::bf16, {64, 48}, 0);
  add("model.fc1.weight", DType::f32, {40, 24}, 1);
  add("model.fc1.bias", DType::f32, {40}, -1);
  add("model.fc2.weight", DType::f16, {12, 10}, 0);
  add("model.fc2.weight_f8_e4m3", DType::f8_e4m3, {16, 8}, 0);
  add("model.fc2.weight_f8_e5m2", DType::f8_e5m2, {16, 8}, 1);
  add("model.fc2.scale", DType::f64, {}, -1);
  add("model.tokens.count_u16", DType::u16, {10}, 0);
  add("model.tokens.ids_u32", DType::u32, {6, 2}, 0);
  add("model.tokens.offsets_u64", DType::u64, {4}, -1);
  add("model.tokens.mask", DType::boolean, {8}, -1);
  add("model.tokens.position_i64", DType::i64, {6}, 0);
  add("optimizer.exp_avg.model.fc1.weight", DType::f32, {40, 24}, 1);
  add("optimizer.step", DType::i64, {}, -1);
  return out;
}

/// Rank `rank`'s half of `t` along its split dimension (1-D or 2-D), or all of it.
Tensor block_of(const GlobalTensor& t, int rank, Shape& offset) {
  const Shape& shape = t.full.shape();
  offset = Shape::zeros(shape.rank());
  if (t.split_dim < 0) return t.full;
  Shape local = shape;
  const auto dim = static_cast<std::size_t>(t.split_dim);
  local[dim] = shape[dim] / 2;
  offset[dim] = local[dim] * rank;
  Tensor block = *Tensor::empty(t.full.dtype(), local, Device::host());
  const std::size_t elem = dtype_size(t.full.dtype());
  const std::int64_t rows = shape.rank() == 2 ? shape[0] : 1;
  const std::int64_t cols = shape.rank() == 2 ? shape[1] : shape[0];
  const std::int64_t local_rows = local.rank() == 2 ? local[0] : 1;
  const std::int64_t local_cols = local.rank() == 2 ? local[1] : local[0];
  const std::int64_t row0 = shape.rank() == 2 ? offset[0] : 0;
  const std::int64_t col0 = shape.rank() == 2 ? offset[1] : offset[0];
  BOOST_REQUIRE(row0 + local_rows <= rows);
  for (std::int64_t r = 0; r < local_rows; ++r) {
    std::memcpy(block.host_data<std::uint8_t>() + static_cast<std::size_t>(r * local_cols) * elem,
                static_cast<const std::uint8_t*>(t.full.data()) +
                    static_cast<std::size_t>((row0 + r) * cols + col0) * elem,
                static_cast<std::size_t>(local_cols) * elem);
  }
  return block;
}

/// Saves `tensors` split over two ranks as step 1 of `root`, with `trainer_state` as its
/// trainer_state.json when not empty.
void save_two_ranks(const std::string& root, const std::vector<GlobalTensor>& tensors,
                    const std::string& trainer_state = "") {
  std::vector<StateDict> states(2);
  for (int rank = 0; rank < 2; ++rank) {
    for (const auto& t : tensors) {
      Shape offset;
      Tensor block = block_of(t, rank, offset);
      states[static_cast<std::size_t>(rank)].add(t.name, block, t.full.shape(), offset,
                                                 t.split_dim < 0 ? rank : 0);
    }
  }
  auto tmp = test::prepare_checkpoint_dir(root, 1);
  BOOST_REQUIRE(tmp.is_ok());
  if (!trainer_state.empty()) std::ofstream(*tmp + "/" + kTrainerStateFile) << trainer_state;
  std::vector<RankSaveReport> reports;
  for (int rank = 0; rank < 2; ++rank) {
    auto engine = SaveEngine::create(rank, {2, 0, false, {}});
    BOOST_REQUIRE(engine.is_ok());
    reports.push_back((*engine)->save(states[static_cast<std::size_t>(rank)],
                                      CheckpointLayout::policy_dir(*tmp), 1));
  }
  BOOST_REQUIRE(test::commit_checkpoint(root, 1, reports, 2, {&states[0], &states[1]}).is_ok());
}

/// The tensors of an export folder, read through its safetensors headers: name -> (file, tensor).
std::map<std::string, std::pair<std::string, Tensor>> read_export(const std::string& dir) {
  std::map<std::string, std::pair<std::string, Tensor>> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string file = entry.path().filename().string();
    if (entry.path().extension() != ".safetensors") continue;
    auto header = parse_safetensors_header(entry.path().string());
    BOOST_REQUIRE_MESSAGE(header.is_ok(), header.status());
    const std::string bytes = test::read_file(entry.path().string());
    // Entries come sorted by name; their data lies back to back in the same order.
    std::uint64_t next_begin = 0;
    for (const auto& e : header->entries) {
      Tensor t = *Tensor::empty(e.dtype, e.shape, Device::host());
      BOOST_REQUIRE(e.end - e.begin == t.nbytes());
      std::memcpy(t.data(), bytes.data() + header->data_start + e.begin, t.nbytes());
      BOOST_TEST(out.count(e.key) == 0u, e.key << " in two files");
      BOOST_TEST(e.begin == next_begin, e.key);
      next_begin = e.end;
      out[e.key] = {file, t};
    }
  }
  return out;
}

/// `t` converted to `dtype` when it is floating point and `dtype` is set.
Tensor exported_form(const Tensor& t, std::optional<DType> dtype) {
  if (!dtype || !is_floating_point(t.dtype())) return t;
  Tensor out = *Tensor::empty(*dtype, t.shape(), Device::host());
  BOOST_REQUIRE(
      convert_elements(t.data(), t.dtype(), out.data(), *dtype, static_cast<std::size_t>(t.numel()))
          .is_ok());
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(export_writes_every_tensor_whole_in_the_hugging_face_layout) {
  TempDir dir;
  const auto fixture = export_fixture();
  save_two_ranks(dir / "ckpt", fixture);
  struct Config {
    std::string what;
    std::string dtype;
    std::string max_shard_size;
  };
  const Config configs[] = {{"model", "as-saved", "5GB"}, {"all", "as-saved", "5GB"},
                            {"model", "bf16", "5GB"},     {"all", "fp32", "5GB"},
                            {"all", "as-saved", "4KB"},   {"model", "bf16", "1500"}};
  int run = 0;
  for (const auto& c : configs) {
    BOOST_TEST_CONTEXT(c.what << " " << c.dtype << " " << c.max_shard_size) {
      const std::string out = dir / ("export" + std::to_string(run++));
      test::CommandRun exported = test::run_command(
          kBin + "/stagehand-ckpt export " + dir / "ckpt" + " " + out + " --what " + c.what +
          " --dtype " + c.dtype + " --max-shard-size " + c.max_shard_size);
      BOOST_REQUIRE_MESSAGE(exported.code == 0, exported.output);
      std::optional<DType> dtype;
      if (c.dtype == "bf16") dtype = DType::bf16;
      if (c.dtype == "fp32") dtype = DType::f32;
      const auto files = read_export(out);
      std::uint64_t total = 0;
      std::size_t expected_count = 0;
      for (const auto& t : fixture) {
        if (c.what == "model" && t.name.rfind("model.", 0) != 0) continue;
        ++expected_count;
        BOOST_TEST_CONTEXT(t.name) {
          auto found = files.find(t.name);
          BOOST_REQUIRE(found != files.end());
          const Tensor& got = found->second.second;
          const Tensor expected = exported_form(t.full, dtype);
          BOOST_TEST((got.dtype() == expected.dtype()));
          BOOST_TEST((got.shape() == expected.shape()));
          BOOST_TEST(test::same_bytes(got, expected));
          total += got.nbytes();
        }
      }
      BOOST_TEST(files.size() == expected_count);
      const bool sharded = c.max_shard_size != "5GB";
      BOOST_TEST(std::filesystem::exists(out + "/model.safetensors") == !sharded);
      BOOST_TEST(std::filesystem::exists(out + "/model.safetensors.index.json") == sharded);
      if (sharded) {
        const auto index =
            nlohmann::json::parse(test::read_file(out + "/model.safetensors.index.json"));
        BOOST_TEST(index["metadata"]["total_size"].get<std::uint64_t>() == total);
        BOOST_TEST(index["weight_map"].size() == expected_count);
        std::set<std::string> shard_files;
        for (const auto& [name, entry] : files) {
          BOOST_TEST(index["weight_map"][name].get<std::string>() == entry.first);
          shard_files.insert(entry.first);
        }
        BOOST_TEST(shard_files.size() > 2u);
        const std::string count = std::to_string(shard_files.size());
        const std::string last = "model-0000" + count + "-of-0000" + count + ".safetensors";
        BOOST_TEST(shard_files.count(last) == 1u, last);
        const std::uint64_t max_bytes = *parse_byte_size(c.max_shard_size);
        for (const auto& file : shard_files) {
          std::uint64_t bytes = 0;
          std::size_t tensors = 0;
          for (const auto& [name, entry] : files) {
            if (entry.first != file) continue;
            bytes += entry.second.nbytes();
            ++tensors;
          }
          BOOST_TEST((bytes <= max_bytes || tensors == 1u), file << " holds " << bytes << " bytes");
        }
      }
      // Every file is a safetensors file with the metadata Hugging Face loaders expect.
      for (const auto& entry : std::filesystem::directory_iterator(out)) {
        if (entry.path().extension() != ".safetensors") continue;
        BOOST_TEST(
            test::read_file(entry.path().string()).find(R"("__metadata__":{"format":"pt"})") !=
            std::string::npos);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(export_of_a_corrupt_chunk_fails_and_leaves_nothing) {
  TempDir dir;
  save_two_ranks(dir / "ckpt", export_fixture());
  auto metadata = read_checkpoint_metadata(dir / "ckpt/global_step_1");
  BOOST_REQUIRE(metadata.is_ok());
  const ChunkMeta& chunk = metadata->tensors.at("model.fc1.weight").chunks.at(1);
  const std::string file = dir / ("ckpt/global_step_1/policy/" + chunk.file);
  std::string bytes = test::read_file(file);
  bytes[chunk.begin + 5] ^= 0x10;
  std::ofstream(file, std::ios::binary) << bytes;
  for (const std::string max_size : {"5GB", "2KB"}) {
    BOOST_TEST_CONTEXT(max_size) {
      const std::string out = dir / "hf";
      test::CommandRun exported =
          test::run_command(kBin + "/stagehand-ckpt export " + dir / "ckpt" + " " + out +
                            " --max-shard-size " + max_size);
      BOOST_TEST(exported.code == 1, exported.output);
      BOOST_TEST(exported.output.find("checksum mismatch") != std::string::npos, exported.output);
      BOOST_TEST(exported.output.find(chunk.file) != std::string::npos, exported.output);
      BOOST_TEST(exported.output.find("model.fc1.weight") != std::string::npos, exported.output);
      BOOST_TEST(!std::filesystem::exists(out));
      // No temporary folder is left beside it either.
      std::size_t entries = 0;
      for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path()))
        ++entries;
      BOOST_TEST(entries == 1u);
    }
  }
}

BOOST_AUTO_TEST_CASE(export_refuses_a_used_output_and_bad_arguments) {
  TempDir dir;
  save_two_ranks(dir / "ckpt", export_fixture());
  const std::string export_cmd = kBin + "/stagehand-ckpt export " + dir / "ckpt" + " ";
  std::filesystem::create_directories(dir / "full");
  std::ofstream(dir / "full/keep.txt") << "mine";
  test::CommandRun used = test::run_command(export_cmd + dir / "full");
  BOOST_TEST(used.code == 1);
  BOOST_TEST(used.output.find("exists and is not an empty folder") != std::string::npos,
             used.output);
  BOOST_TEST(test::read_file(dir / "full/keep.txt") == "mine");
  // An empty folder is taken, and a global_step_N folder works as well as the root.
  std::filesystem::create_directories(dir / "empty");
  test::CommandRun into_empty = test::run_command(export_cmd + dir / "empty");
  BOOST_TEST(into_empty.code == 0, into_empty.output);
  BOOST_TEST(std::filesystem::exists(dir / "empty/model.safetensors"));
  test::CommandRun from_step = test::run_command(
      kBin + "/stagehand-ckpt export " + dir / "ckpt/global_step_1 " + dir / "nested/a/out");
  BOOST_TEST(from_step.code == 0, from_step.output);
  BOOST_TEST(std::filesystem::exists(dir / "nested/a/out/model.safetensors"));
  struct Bad {
    std::string args;
    std::string says;
  };
  const Bad bads[] = {{dir / "x --max-shard-size 5XB", "unknown unit"},
                      {dir / "x --max-shard-size GB", "does not start with a number"},
                      {dir / "x --max-shard-size 0", "less than one byte"},
                      {dir / "x --dtype fp16", "--dtype"},
                      {dir / "x --what optimizer", "--what"},
                      {"s3://bucket/out", "local folder"}};
  for (const auto& bad : bads) {
    BOOST_TEST_CONTEXT(bad.args) {
      test::CommandRun run = test::run_command(export_cmd + bad.args);
      BOOST_TEST(run.code != 0);
      BOOST_TEST(run.output.find(bad.says) != std::string::npos, run.output);
    }
  }
  BOOST_TEST(!std::filesystem::exists(dir / "x"));
}

// Issue 59: an output inside the checkpoint tree (the step's folder, or the root beside its
// tracker and other steps, however spelled) is refused before anything is written.
BOOST_AUTO_TEST_CASE(export_refuses_an_output_inside_the_checkpoint_tree) {
  TempDir dir;
  save_two_ranks(dir / "ckpt", export_fixture());
  const auto before = test::files_of(dir / "ckpt");
  std::filesystem::create_directories(dir / "other");
  std::filesystem::create_symlink(dir / "ckpt", dir / "link");
  const std::string inside[][2] = {{dir / "ckpt", dir / "ckpt/hf"},
                                   {dir / "ckpt", dir / "ckpt/global_step_1/hf"},
                                   {dir / "ckpt", dir / "ckpt/global_step_1/policy/hf"},
                                   {dir / "ckpt/global_step_1", dir / "ckpt/exports/step1"},
                                   {dir / "ckpt", dir / "other/../ckpt/./hf"},
                                   {dir / "ckpt", dir / "link/hf"},
                                   {dir / "link/global_step_1", dir / "ckpt/hf"}};
  for (const auto& [from, out] : inside) {
    BOOST_TEST_CONTEXT(from << " -> " << out) {
      test::CommandRun run = test::run_command(kBin + "/stagehand-ckpt export " + from + " " + out);
      BOOST_TEST(run.code == 1, run.output);
      BOOST_TEST(run.output.find("lies inside the checkpoint tree '" + (dir / "ckpt") + "'") != std::string::npos,
                 run.output);
    }
  }
  BOOST_TEST((test::files_of(dir / "ckpt") == before), "the checkpoint tree was changed");
  // A sibling whose name starts as the root's does is outside it.
  test::CommandRun beside = test::run_command(kBin + "/stagehand-ckpt export " + dir / "ckpt " + dir / "ckpt-hf");
  BOOST_TEST(beside.code == 0, beside.output);
  BOOST_TEST(std::filesystem::exists(dir / "ckpt-hf/model.safetensors"));
}

// Issue 59: verify, export and a tier copy report their bytes done to a ProgressFn: phase by
// phase, never going back, ending at the phase's total (the bytes they move).
BOOST_AUTO_TEST_CASE(long_operations_report_their_progress_to_the_end) {
  TempDir dir;
  const auto fixture = export_fixture();
  save_two_ranks(dir / "ckpt", fixture);
  struct Heard {
    std::string phase;
    std::uint64_t done;
    std::uint64_t total;
  };
  std::vector<Heard> heard;
  const ProgressFn listen = [&](std::string_view phase, std::uint64_t done, std::uint64_t total) {
    heard.push_back({std::string(phase), done, total});
  };
  auto check = [&](const std::vector<std::string>& phases, std::uint64_t total) {
    std::vector<std::string> seen;
    for (std::size_t i = 0; i < heard.size(); ++i) {
      const Heard& h = heard[i];
      if (seen.empty() || seen.back() != h.phase) {
        seen.push_back(h.phase);
        BOOST_TEST(h.done == 0u, h.phase << " starts at 0");
      } else {
        BOOST_TEST(h.done >= heard[i - 1].done, h.phase << " went back");
      }
      BOOST_TEST(h.total == total, h.phase);
      BOOST_TEST(h.done <= h.total, h.phase);
      if (i + 1 == heard.size() || heard[i + 1].phase != h.phase) BOOST_TEST(h.done == h.total, h.phase << " ends");
    }
    BOOST_TEST(seen == phases);
    heard.clear();
  };
  const auto fs = local_file_system();
  const std::string step_dir = dir / "ckpt/global_step_1";
  auto metadata = read_checkpoint_metadata(*fs, step_dir);
  BOOST_REQUIRE(metadata.is_ok());
  std::uint64_t file_bytes = 0;
  for (const auto& [name, file] : metadata->files) file_bytes += file.size;
  BOOST_REQUIRE(verify_checkpoint(*fs, step_dir, listen)->ok());
  check({"verify"}, file_bytes);
  ExportOptions options;
  options.what = ExportOptions::What::all;
  options.progress = listen;
  ExportReport report;
  BOOST_REQUIRE(export_checkpoint(*fs, dir / "ckpt", dir / "hf", options, &report).is_ok());
  check({"export"}, report.bytes);
  BOOST_TEST(report.bytes > 0u);
  TierCopyOptions copy;
  copy.progress = listen;
  copy.threads = 3;
  BOOST_REQUIRE(copy_committed_step(CheckpointStore(fs, dir / "ckpt"), CheckpointStore(fs, dir / "copy"), 1, copy).is_ok());
  check({"copy", "read back"}, file_bytes);
}

// Issue 59: on a terminal (or with --progress always) the long commands draw a progress line
// that ends at 100%; piped, by default, they draw none.
BOOST_AUTO_TEST_CASE(the_long_commands_draw_a_progress_line_when_asked) {
  TempDir dir;
  save_two_ranks(dir / "ckpt", export_fixture());
  const std::string tool = kBin + "/stagehand-ckpt ";
  struct Command {
    std::string args;
    std::vector<std::string> lines;
  };
  const Command commands[] = {{"verify " + dir / "ckpt", {"verify: "}},
                              {"export " + dir / "ckpt " + dir / "hf", {"export: "}},
                              {"copy " + dir / "ckpt " + dir / "copy", {"copy: ", "read back: "}}};
  for (const auto& c : commands) {
    BOOST_TEST_CONTEXT(c.args) {
      test::CommandRun quiet = test::run_command(tool + c.args);
      BOOST_TEST(quiet.code == 0, quiet.output);
      BOOST_TEST(quiet.output.find('\r') == std::string::npos, quiet.output);
      std::filesystem::remove_all(dir / "hf");
      std::filesystem::remove_all(dir / "copy");
      test::CommandRun shown = test::run_command(tool + c.args + " --progress always");
      BOOST_TEST(shown.code == 0, shown.output);
      for (const auto& line : c.lines) {
        const auto at = shown.output.find("\r" + line);
        BOOST_TEST(at != std::string::npos, line << " in: " << shown.output);
        const auto end = shown.output.find('\n', at);
        BOOST_TEST(shown.output.substr(at, end - at).find("(100%)") != std::string::npos, shown.output);
      }
      std::filesystem::remove_all(dir / "hf");
      std::filesystem::remove_all(dir / "copy");
    }
  }
  test::CommandRun bad = test::run_command(tool + "verify " + dir / "ckpt --progress sometimes");
  BOOST_TEST(bad.code != 0);
  BOOST_TEST(bad.output.find("--progress") != std::string::npos, bad.output);
}

// stagehand-ckpt copy: a committed step into another root, checked on both sides, committed
// there with its tracker; a damaged source, a tracker it would move back and a root in use are
// refused, and leave the destination as it was.
BOOST_AUTO_TEST_CASE(copy_commits_a_checked_step_into_another_root) {
  TempDir dir;
  save_two_ranks(dir / "ckpt", export_fixture());
  const std::string tool = kBin + "/stagehand-ckpt ";
  test::CommandRun copied = test::run_command(tool + "copy " + dir / "ckpt " + dir / "durable");
  BOOST_TEST_REQUIRE(copied.code == 0, copied.output);
  BOOST_TEST(copied.output.find("copied step 1 from " + dir / "ckpt") != std::string::npos, copied.output);
  BOOST_TEST(test::read_file(dir / "durable/latest_ckpt_global_step.txt") == "1\n");
  auto a = test::files_of(dir / "ckpt/global_step_1");
  auto b = test::files_of(dir / "durable/global_step_1");
  BOOST_TEST(a.size() == b.size());
  for (const auto& [name, bytes] : a) BOOST_TEST((b[name] == bytes), name);
  test::CommandRun verified = test::run_command(tool + "verify " + dir / "durable");
  BOOST_TEST(verified.code == 0, verified.output);
  test::CommandRun again = test::run_command(tool + "copy " + dir / "ckpt " + dir / "durable --step 1");
  BOOST_TEST(again.code == 0, again.output);
  BOOST_TEST(again.output.find("was replaced") != std::string::npos, again.output);
  // A flipped byte in the source: refused, the destination's step untouched.
  const std::string data = dir / "ckpt/global_step_1/policy/__0_0.safetensors";
  std::string bytes = test::read_file(data);
  bytes[bytes.size() - 3] = static_cast<char>(bytes[bytes.size() - 3] ^ 0x11);
  std::ofstream(data, std::ios::binary | std::ios::trunc) << bytes;
  test::CommandRun damaged = test::run_command(tool + "copy " + dir / "ckpt " + dir / "durable");
  BOOST_TEST(damaged.code == 1, damaged.output);
  BOOST_TEST(damaged.output.find("the source is damaged and is not copied") != std::string::npos, damaged.output);
  BOOST_TEST((test::files_of(dir / "durable/global_step_1") == b));
  // A destination whose tracker names a newer step.
  std::ofstream(dir / "durable/latest_ckpt_global_step.txt", std::ios::trunc) << "5\n";
  test::CommandRun back = test::run_command(tool + "copy " + dir / "ckpt " + dir / "durable");
  BOOST_TEST(back.code == 2, back.output);
  BOOST_TEST(back.output.find("names step 5, newer than step 1") != std::string::npos, back.output);
  BOOST_TEST(test::read_file(dir / "durable/latest_ckpt_global_step.txt") == "5\n");
  // A root another run holds.
  auto held = CheckpointStore(local_file_system(), dir / "busy").lock();
  BOOST_REQUIRE(held.is_ok());
  std::filesystem::remove(data);
  save_two_ranks(dir / "clean", export_fixture());
  test::CommandRun busy = test::run_command(tool + "copy " + dir / "clean " + dir / "busy");
  BOOST_TEST(busy.code == 2, busy.output);
  BOOST_TEST(busy.output.find("is in use by another run") != std::string::npos, busy.output);
  BOOST_TEST(!std::filesystem::exists(dir / "busy/global_step_1"));
  test::CommandRun no_tracker = test::run_command(tool + "copy " + dir / "nothing " + dir / "other");
  BOOST_TEST(no_tracker.code != 0, no_tracker.output);
}

BOOST_AUTO_TEST_CASE(parse_byte_size_reads_hugging_face_sizes) {
  BOOST_TEST(*parse_byte_size("5GB") == 5000000000ull);
  BOOST_TEST(*parse_byte_size("500MB") == 500000000ull);
  BOOST_TEST(*parse_byte_size("2GiB") == 2147483648ull);
  BOOST_TEST(*parse_byte_size("1.5gb") == 1500000000ull);
  BOOST_TEST(*parse_byte_size("4096") == 4096ull);
  BOOST_TEST(*parse_byte_size("10KiB") == 10240ull);
  for (const std::string bad :
       {"", "GB", "5 XB", "-1", "1..5GB", "0", "0.1", "1e3", "99999999999TB"}) {
    BOOST_TEST_CONTEXT(bad) {
      auto parsed = parse_byte_size(bad);
      BOOST_TEST(!parsed.is_ok());
      BOOST_TEST((parsed.status().code() == ErrorCode::invalid_argument));
    }
  }
}

BOOST_AUTO_TEST_CASE(inspect_shows_the_trainer_and_the_layout) {
  TempDir dir;
  const auto fixture = export_fixture();
  save_two_ranks(
      dir / "with", fixture,
      R"({"step": 1, "kind": "sft", "layout": {"tensor_parallel": 2, "data_parallel": 1}})");
  test::CommandRun with = test::run_command(kBin + "/stagehand-ckpt inspect " + dir / "with");
  BOOST_TEST(with.code == 0, with.output);
  BOOST_TEST(with.output.find("trainer: sft") != std::string::npos, with.output);
  BOOST_TEST(with.output.find("layout: tensor_parallel 2 x data_parallel 1") != std::string::npos,
             with.output);
  BOOST_TEST(with.output.find("ranks that wrote files: 2") != std::string::npos, with.output);
  BOOST_TEST(with.output.find("F8_E4M3") != std::string::npos, with.output);
  save_two_ranks(dir / "older", fixture, R"({"step": 1, "kind": "sync"})");
  test::CommandRun older = test::run_command(kBin + "/stagehand-ckpt inspect " + dir / "older");
  BOOST_TEST(older.output.find("trainer: sync") != std::string::npos, older.output);
  BOOST_TEST(older.output.find("layout: not recorded") != std::string::npos, older.output);
  save_two_ranks(dir / "without", fixture);
  test::CommandRun without = test::run_command(kBin + "/stagehand-ckpt inspect " + dir / "without");
  BOOST_TEST(without.code == 0, without.output);
  BOOST_TEST(without.output.find("trainer: not recorded") != std::string::npos, without.output);
  BOOST_TEST(without.output.find("layout: not recorded") != std::string::npos, without.output);
}

BOOST_AUTO_TEST_CASE(verify_accepts_a_good_checkpoint_and_inspect_lists_it) {
  TempDir dir;
  test::CommandRun save = test::run_command(bench_save(dir.path()));
  BOOST_REQUIRE_MESSAGE(save.code == 0, save.output);
  BOOST_TEST(save.output.find("\"host_staging_peak_bytes\"") != std::string::npos);
  test::CommandRun verify = test::run_command(kBin + "/stagehand-ckpt verify " + dir.path());
  BOOST_TEST(verify.code == 0, verify.output);
  BOOST_TEST(verify.output.find("OK") != std::string::npos);
  BOOST_TEST(every_rank_loads(dir.path()));
  test::CommandRun inspect = test::run_command(kBin + "/stagehand-ckpt inspect " + dir / "global_step_1");
  BOOST_TEST(inspect.code == 0);
  BOOST_TEST(inspect.output.find("layer0.param0") != std::string::npos);
  BOOST_TEST(inspect.output.find("__1_2.safetensors") != std::string::npos);
  BOOST_TEST(inspect.output.find("8 tensors") != std::string::npos, inspect.output);
}

BOOST_AUTO_TEST_CASE(verify_catches_a_flipped_byte_and_a_truncated_file) {
  for (std::string damage : {"flip", "truncate"}) {
    BOOST_TEST_CONTEXT(damage) {
      TempDir dir;
      BOOST_REQUIRE(test::run_command(bench_save(dir.path())).code == 0);
      std::string file = dir / "global_step_1/policy/__1_1.safetensors";
      auto size = std::filesystem::file_size(file);
      if (damage == "flip") {
        std::string bytes = test::read_file(file);
        bytes[bytes.size() - 100] ^= 1;
        std::ofstream(file, std::ios::binary) << bytes;
      } else {
        std::filesystem::resize_file(file, size - 1000);
      }
      test::CommandRun verify = test::run_command(kBin + "/stagehand-ckpt verify " + dir.path());
      BOOST_TEST(verify.code == 1, verify.output);
      BOOST_TEST(verify.output.find("__1_1.safetensors") != std::string::npos, verify.output);
      BOOST_TEST(verify.output.find("FAILED") != std::string::npos);
    }
  }
}

BOOST_AUTO_TEST_CASE(bad_paths_and_arguments_fail_clearly) {
  TempDir dir;
  test::CommandRun missing = test::run_command(kBin + "/stagehand-ckpt verify " + dir / "nothing");
  BOOST_TEST(missing.code == 2);
  BOOST_TEST(missing.output.find("is not a folder") != std::string::npos, missing.output);
  test::CommandRun empty = test::run_command(kBin + "/stagehand-ckpt inspect " + dir.path());
  BOOST_TEST(empty.code == 2);
  BOOST_TEST(empty.output.find("latest_ckpt_global_step.txt") != std::string::npos, empty.output);
  test::CommandRun bad_size = test::run_command(kBin + "/stagehand-bench save --out " + dir.path() + " --bytes-per-rank 5X");
  BOOST_TEST(bad_size.code != 0);
  BOOST_TEST(bad_size.output.find("--bytes-per-rank") != std::string::npos, bad_size.output);
  test::CommandRun bad_staging = test::run_command(kBin + "/stagehand-bench save --out " + dir.path() + " --thread-count 2 --staging-buckets 3");
  BOOST_TEST(bad_staging.code != 0);
  BOOST_TEST(bad_staging.output.find("ckpt_save_staging_buckets") != std::string::npos, bad_staging.output);
}

BOOST_AUTO_TEST_CASE(bench_refuses_a_bytes_per_rank_that_is_not_a_size_within_its_limit) {
  for (std::string value : {"1e30", "2e19", "inf", "-1G", "nan", "0", "0.5", "2e15", "1e400"}) {
    BOOST_TEST_CONTEXT(value) {
      TempDir dir;
      test::CommandRun run = test::run_command(kBin + "/stagehand-bench save --out " + dir.path() +
                                               " --ranks 1 --bytes-per-rank " + value);
      BOOST_TEST(run.code == 2, run.output);
      BOOST_TEST(run.output.find("--bytes-per-rank '" + value + "'") != std::string::npos, run.output);
      BOOST_TEST(run.output.find("no_space") == std::string::npos, run.output);
      BOOST_TEST(!std::filesystem::exists(dir / "global_step_1"));
    }
  }
  TempDir dir;
  test::CommandRun above = test::run_command(kBin + "/stagehand-bench save --out " + dir.path() +
                                             " --ranks 1 --bytes-per-rank 1e30");
  BOOST_TEST(above.output.find("at most 1125899906842624 bytes (2^50)") != std::string::npos, above.output);
  test::CommandRun below = test::run_command(kBin + "/stagehand-bench save --out " + dir.path() +
                                             " --ranks 1 --bytes-per-rank -1G");
  BOOST_TEST(below.output.find("at least 1 byte") != std::string::npos, below.output);
}

BOOST_AUTO_TEST_CASE(verify_fails_every_checkpoint_that_cannot_load) {
  for (std::string damage : {"duplicate", "remove", "rank", "step", "byte_range"}) {
    BOOST_TEST_CONTEXT(damage) {
      TempDir dir;
      BOOST_REQUIRE(test::run_command(bench_save(dir.path())).code == 0);
      std::string ckpt = dir / "global_step_1";
      std::string meta = ckpt + "/policy/metadata.json";
      if (damage == "duplicate" || damage == "remove" || damage == "rank") {
        edit_metadata(ckpt, [&](CheckpointMetadata& m) {
          auto& chunks = m.tensors.at("layer0.param0").chunks;
          BOOST_REQUIRE(chunks.size() == 2u);
          if (damage == "duplicate") chunks.push_back(chunks[0]);
          if (damage == "remove") chunks.pop_back();
          // The same elements and bytes, but one dimension instead of two.
          if (damage == "rank") chunks[0].shape = Shape{chunks[0].shape.numel()};
        });
      } else if (damage == "step") {
        edit_text(meta, R"("step": 1)", R"("step": 1.5)");
      } else {
        edit_text(meta, R"("byte_range": \[\s*(\d+))", R"("byte_range": [ $1.0)");
      }
      BOOST_TEST(!every_rank_loads(ckpt));
      test::CommandRun verify = test::run_command(kBin + "/stagehand-ckpt verify " + ckpt);
      BOOST_TEST(verify.code == 1, verify.output);
      BOOST_TEST(verify.output.find("FAILED") != std::string::npos, verify.output);
      BOOST_TEST(verify.output.find("metadata.json") != std::string::npos, verify.output);
      std::string named = damage == "step" || damage == "byte_range" ? damage : "layer0.param0";
      BOOST_TEST(verify.output.find(named) != std::string::npos, verify.output);
    }
  }
}

BOOST_AUTO_TEST_CASE(malformed_fields_are_errors_not_crashes) {
  struct Damage {
    std::string file;
    std::string pattern;
    std::string replacement;
    std::string named;
  };
  const Damage damages[] = {
      {"__1_1.safetensors", R"("data_offsets":\[(\d+),(\d+)\])", R"("data_offsets":["$1","$2"])",
       "data_offsets"},
      {"__1_1.safetensors", R"("data_offsets":\[(\d+),(\d+)\])",
       R"("data_offsets":{"a":$1,"b":$2})", "data_offsets"},
      {"__1_1.safetensors", R"("data_offsets":\[(\d+),)", R"("data_offsets":[1e300,)",
       "data_offsets"},
      // Found by safetensors_header_fuzz: a range that ends before it begins.
      {"__1_1.safetensors", R"("data_offsets":\[(\d+),(\d+)\])", R"("data_offsets":[$2,$1])",
       "data_offsets"},
      {"__1_1.safetensors", R"("dtype":"[A-Z0-9]+")", R"("dtype":7)", "dtype"},
      {"__1_1.safetensors", R"("shape":\[)", R"("shape":[4294967296,4294967296,)", "shape"},
      {"metadata.json", R"("format": "[a-z-]+")", R"("format": 5)", "format"},
      {"metadata.json", R"("version": 1)", R"("version": "1")", "version"},
      {"metadata.json", R"("objects": \{)", R"("objects": {"n": 5,)", "objects"},
      {"metadata.json", R"("file": "[^"]+")", R"("file": ["x"])", "file"},
      {"metadata.json", R"("tensors": \{)", R"("tensors": {"t": [],)", "tensors"},
  };
  for (const auto& damage : damages) {
    BOOST_TEST_CONTEXT(damage.file << ": " << damage.replacement) {
      TempDir dir;
      BOOST_REQUIRE(test::run_command(bench_save(dir.path())).code == 0);
      std::string path = dir / ("global_step_1/policy/" + damage.file);
      if (damage.file == "metadata.json") {
        edit_text(path, damage.pattern, damage.replacement);
      } else {
        edit_safetensors_header(path, damage.pattern, damage.replacement);
      }
      BOOST_TEST(!every_rank_loads(dir.path()));
      test::CommandRun verify = test::run_command(kBin + "/stagehand-ckpt verify " + dir.path());
      BOOST_TEST(verify.code == 1, verify.output);
      BOOST_TEST(verify.output.find(damage.file) != std::string::npos, verify.output);
      BOOST_TEST(verify.output.find(damage.named) != std::string::npos, verify.output);
      if (damage.file == "metadata.json") {
        test::CommandRun inspect =
            test::run_command(kBin + "/stagehand-ckpt inspect " + dir.path());
        BOOST_TEST(inspect.code == 2, inspect.output);
        BOOST_TEST(inspect.output.find(damage.named) != std::string::npos, inspect.output);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(the_bench_takes_the_roots_lock) {
  TempDir dir;
  auto held = test::local_store(dir.path()).lock();  // a trainer or another bench on the root
  BOOST_REQUIRE(held.is_ok());
  test::CommandRun second = test::run_command(kBin + "/stagehand-bench save --out " + dir.path() + " --bytes-per-rank 1M");
  BOOST_TEST(second.code == 2, second.output);
  BOOST_TEST(second.output.find("lock") != std::string::npos, second.output);
  BOOST_TEST(!std::filesystem::exists(dir / "global_step_1"));
}

BOOST_AUTO_TEST_CASE(the_bench_commit_refuses_an_out_inside_its_from_and_export_an_empty_out) {
  TempDir dir;
  const std::string root = dir / "ckpt";
  BOOST_REQUIRE(test::run_command(kBin + "/stagehand-bench save --out " + root + " --bytes-per-rank 1M").code == 0);
  // --out is removed before each commit: equal to, inside, or holding --from would lose data.
  for (const std::string& out : {root, root + "/sub", root + "/global_step_1", dir.path()}) {
    BOOST_TEST_CONTEXT(out) {
      auto run = test::run_command(kBin + "/stagehand-bench commit --from " + root + " --out " + out);
      BOOST_TEST(run.code == 1, run.output);
      BOOST_TEST(run.output.find("lie inside one another") != std::string::npos, run.output);
    }
  }
  auto verified = test::run_command(kBin + "/stagehand-ckpt verify " + root);
  BOOST_TEST(verified.code == 0, verified.output);
  // An empty output path is an error that names it, not an uncaught exception (was rc 134).
  auto empty = test::run_command(kBin + "/stagehand-ckpt export " + root + " ''");
  BOOST_TEST(empty.code == 1, empty.output);
  BOOST_TEST(empty.output.find("needs the path of an output folder") != std::string::npos, empty.output);
}

#define BOOST_TEST_MODULE metadata
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bench/synthetic_state.hpp"
#include "tests/checkpoint_test_util.hpp"
#include "stagehand/checkpoint/save/in_process_save.hpp"
#include "stagehand/checkpoint/load/loader.hpp"
#include "stagehand/checkpoint/load/checkpoint_reader.hpp"
#include "stagehand/checkpoint/load/load_plan.hpp"
#include "stagehand/checkpoint/load/resolve.hpp"
#include "stagehand/checkpoint/load/verify.hpp"
#include "stagehand/storage/default_file_system.hpp"
#include "stagehand/checkpoint/metadata/metadata_index.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;
using stagehand::test::TempDir;
namespace fs = std::filesystem;

namespace {

/// Names that exercise every kind of JSON escape, and UTF-8 beyond ASCII.
const std::vector<std::string> kAwkwardNames = {"plain",
                                                "with \"quotes\"",
                                                "back\\slash",
                                                "tab\tnew\nline",
                                                std::string("bell\x07nul\x01", 10),
                                                "del\x7f",
                                                "caf\xc3\xa9 \xe2\x82\xac",
                                                "slash/name"};

/// A tensor split into `parts` chunks along dimension `dim` of a [rows, cols] global shape, in
/// files "__<part>_0.safetensors".
TensorMeta split_tensor(std::int64_t rows, std::int64_t cols, int parts, std::size_t dim) {
  TensorMeta t;
  t.dtype = DType::f32;
  t.global_shape = Shape{rows, cols};
  const std::int64_t along = dim == 0 ? rows : cols;
  for (int p = 0; p < parts; ++p) {
    const std::int64_t begin = along * p / parts;
    const std::int64_t end = along * (p + 1) / parts;
    ChunkMeta c;
    c.offsets = dim == 0 ? Shape{begin, 0} : Shape{0, begin};
    c.shape = dim == 0 ? Shape{end - begin, cols} : Shape{rows, end - begin};
    c.file = "__" + std::to_string(p) + "_0.safetensors";
    c.begin = 4096 + static_cast<std::uint64_t>(p) * 8;
    c.end = c.begin + static_cast<std::uint64_t>(c.shape.numel()) * 4;
    c.xxh3 = 0x0123456789abcdefull + static_cast<std::uint64_t>(p);
    t.chunks.push_back(c);
  }
  return t;
}

/// Metadata of `parts` files holding one chunk of each tensor.
CheckpointMetadata sample_metadata(int parts, const std::vector<std::string>& names) {
  CheckpointMetadata m;
  m.step = 7;
  for (std::size_t i = 0; i < names.size(); ++i)
    m.tensors[names[i]] = split_tensor(8 * parts, 6, parts, i % 2);
  for (int p = 0; p < parts; ++p)
    m.files["__" + std::to_string(p) + "_0.safetensors"] = {1u << 20, 42};
  for (const auto& name : names)
    m.objects[name] = "value of " + name;
  m.trainer_state = FileMeta{12, 99};
  return m;
}

/// metadata.json as the first writer made it: a JSON tree dumped with one space of indent, its
/// checksum the XXH3 of the tree's compact dump.
std::string first_writer(const CheckpointMetadata& m) {
  using nlohmann::json;
  auto shape = [](const Shape& s) { return json(s.dims()); };
  json tensors = json::object();
  for (const auto& [name, t] : m.tensors) {
    json chunks = json::array();
    for (const auto& c : t.chunks) {
      chunks.push_back({{"offsets", shape(c.offsets)},
                        {"shape", shape(c.shape)},
                        {"file", c.file},
                        {"byte_range", {c.begin, c.end}},
                        {"xxh3", xxh3_hex(c.xxh3)}});
    }
    tensors[name] = {{"dtype", std::string(dtype_name(t.dtype))},
                     {"shape", shape(t.global_shape)},
                     {"chunks", chunks}};
  }
  json files = json::object();
  for (const auto& [name, f] : m.files)
    files[name] = {{"size", f.size}, {"xxh3", xxh3_hex(f.xxh3)}};
  json root = {{"format", kFormatName}, {"version", kFormatVersion}, {"step", m.step},
               {"tensors", tensors},    {"objects", m.objects},      {"files", files}};
  if (m.trainer_state)
    root["trainer_state"] = {{"size", m.trainer_state->size},
                             {"xxh3", xxh3_hex(m.trainer_state->xxh3)}};
  const std::string compact = root.dump();
  root["checksum"] = xxh3_hex(xxh3(compact.data(), compact.size()));
  return root.dump(1) + "\n";
}

/// `text` with the first `from` replaced by `to`.
std::string replace_first(std::string text, const std::string& from, const std::string& to) {
  const std::size_t at = text.find(from);
  BOOST_REQUIRE_MESSAGE(at != std::string::npos, "no '" << from << "' in the text");
  return text.replace(at, from.size(), to);
}

/// What the checksum of `text` must be, by another road: the nlohmann::json tree of the file
/// without its "checksum" member, dumped compactly.
std::uint64_t checksum_of_tree(const std::string& text) {
  auto tree = nlohmann::json::parse(text);
  tree.erase("checksum");
  const std::string compact = tree.dump();
  return xxh3(compact.data(), compact.size());
}

/// Whether `m` is a metadata_from_json error saying that the file was changed after it was
/// written (a checksum mismatch), not an error about one of its fields.
bool is_checksum_mismatch(const Result<CheckpointMetadata>& m) {
  return !m.is_ok() && m.status().code() == ErrorCode::corruption &&
         m.status().message().find(
             "'metadata.json': was changed after it was written: its content "
             "has XXH3 ") != std::string::npos &&
         m.status().message().find(", its field checksum says ") != std::string::npos;
}

/// Indices of the chunks of `t` that share an element with `block`, by looking at every chunk.
std::vector<std::size_t> overlapping_by_scan(const TensorMeta& t, const ShardedTensorDesc& block) {
  std::vector<std::size_t> found;
  for (std::size_t i = 0; i < t.chunks.size(); ++i) {
    bool shares = true;
    for (std::size_t d = 0; d < block.local_shape.rank(); ++d) {
      shares &= std::max(t.chunks[i].offsets[d], block.global_offset[d]) <
                std::min(t.chunks[i].offsets[d] + t.chunks[i].shape[d],
                         block.global_offset[d] + block.local_shape[d]);
    }
    if (shares) found.push_back(i);
  }
  return found;
}

/// A live state of one block of every tensor of `m`: part `part` of `parts` along `dim`.
StateDict live_block(const CheckpointMetadata& m, int part, int parts, std::size_t dim) {
  StateDict state;
  for (const auto& [name, t] : m.tensors) {
    const std::int64_t along = t.global_shape[dim];
    const std::int64_t begin = along * part / parts;
    const std::int64_t end = along * (part + 1) / parts;
    Shape offset = Shape::zeros(2);
    Shape local = t.global_shape;
    offset[dim] = begin;
    local[dim] = end - begin;
    state.add(name, *Tensor::empty(t.dtype, local, Device::host()), t.global_shape, offset, 0);
  }
  return state;
}

}  // namespace

BOOST_AUTO_TEST_CASE(what_the_first_writer_wrote_still_reads_and_reads_the_same) {
  const CheckpointMetadata m = sample_metadata(3, kAwkwardNames);
  auto old = metadata_from_json(first_writer(m), "old.json");
  BOOST_REQUIRE_MESSAGE(old.is_ok(), old.status().to_string());
  BOOST_TEST(metadata_to_json(*old) == metadata_to_json(m));
  auto now = metadata_from_json(metadata_to_json(m), "new.json");
  BOOST_REQUIRE_MESSAGE(now.is_ok(), now.status().to_string());
  BOOST_TEST(metadata_to_json(*now) == metadata_to_json(m));
  // The same fields as the first writer's, whatever the layout of the text.
  BOOST_TEST(nlohmann::json::parse(metadata_to_json(m)) == nlohmann::json::parse(first_writer(m)));
}

BOOST_AUTO_TEST_CASE(the_fuzz_corpus_of_first_writer_files_reads) {
  for (const auto& entry :
       fs::directory_iterator(test::source_dir() + "/tests/fuzz/corpus/metadata_fuzz")) {
    const std::string text = test::read_file(entry.path().string());
    auto m = metadata_from_json(text, entry.path().string());
    BOOST_TEST(m.is_ok(), entry.path().string() << ": " << m.status().to_string());
    if (m.is_ok()) BOOST_TEST(metadata_from_json(metadata_to_json(*m), "again").is_ok());
  }
}

BOOST_AUTO_TEST_CASE(the_checksum_is_that_of_the_compact_text_without_it) {
  const CheckpointMetadata m = sample_metadata(3, kAwkwardNames);
  for (const std::string& text : {metadata_to_json(m), first_writer(m)}) {
    const std::uint64_t expected = checksum_of_tree(text);
    BOOST_TEST(metadata_text_checksum(text) == expected);
    BOOST_TEST(*parse_xxh3_hex(nlohmann::json::parse(text)["checksum"].get<std::string>()) ==
               expected);
  }
}

BOOST_AUTO_TEST_CASE(the_checksum_leaves_out_only_whitespace_and_the_top_level_member) {
  using nlohmann::json;
  std::vector<json> docs = {
      json::object(),
      {{"a", 1}},
      {{"checksum", "0123456789abcdef"}},
      {{"a", 1}, {"checksum", "last"}},
      {{"a", 1}, {"checksum", "between"}, {"z", json::array({1, 2})}},
      {{"checksum", {{"checksum", 1}}}, {"d", "checksum"}},
      {{"a", {{"checksum", "nested"}, {"list", json::array({"checksum", " \"checksum\": 1, "})}}},
       {"checksum", "x"}},
      {{"checksum", "x"}, {"caf\xc3\xa9 \xe2\x82\xac", "\x01\x1f\x7f"}}};
  // Escapes, quotes and spaces on every byte of an eight-byte word.
  for (std::size_t pad = 0; pad < 16; ++pad) {
    docs.push_back({{"checksum", "x"},
                    {std::string(pad, 'k'),
                     std::string(pad, 'p') + "a \"quoted\" \\\\ \t\n\"checksum\": \"\\"},
                    {"s", std::string(pad, ' ') + "\\\""},
                    {"t", json::array({std::string(pad, '"'), std::string(pad, '\\')})}});
  }
  for (const json& doc : docs) {
    json without = doc;
    without.erase("checksum");
    const std::string compact = without.dump();
    const std::uint64_t expected = xxh3(compact.data(), compact.size());
    for (int indent : {-1, 0, 1, 3, 8}) {
      for (char fill : {' ', '\t'}) {
        const std::string text = doc.dump(indent, fill);
        BOOST_TEST(metadata_text_checksum(text) == expected, text);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_file_reindented_still_verifies) {
  const CheckpointMetadata m = sample_metadata(3, kAwkwardNames);
  const std::string text = metadata_to_json(m);
  const auto tree = nlohmann::json::parse(text);
  std::string crlf;
  for (char c : text)
    crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  // Strings escape every control character, so the writer's line feeds all lie outside them.
  BOOST_REQUIRE(crlf.size() > text.size());
  const std::vector<std::pair<std::string, std::string>> layouts = {
      {"compact", tree.dump()},
      {"indent 4", tree.dump(4)},
      {"tabs", tree.dump(1, '\t')},
      {"CRLF", crlf},
      {"padded", " \t\r\n" + text + "\n\n"}};
  for (const auto& [name, layout] : layouts) {
    BOOST_TEST_CONTEXT(name) {
      auto read = metadata_from_json(layout, "metadata.json");
      BOOST_REQUIRE_MESSAGE(read.is_ok(), read.status().to_string());
      BOOST_TEST(metadata_to_json(*read) == text);
    }
  }
}

BOOST_AUTO_TEST_CASE(the_checksum_member_may_stand_anywhere_in_the_top_level) {
  const std::string text = metadata_to_json(sample_metadata(2, {"w"}));
  const auto checksum = nlohmann::json::parse(text)["checksum"].get<std::string>();
  const std::string member = "\"checksum\": \"" + checksum + "\"";
  const std::string without = replace_first(text, "\n " + member + ",", "");
  const std::vector<std::pair<std::string, std::string>> places = {
      {"last", replace_first(without, "\n}", ",\n " + member + "\n}")},
      {"in the middle", replace_first(without, "\n \"step\"", "\n " + member + ",\n \"step\"")}};
  for (const auto& [where, moved] : places) {
    BOOST_TEST_CONTEXT(where) {
      auto read = metadata_from_json(moved, "metadata.json");
      BOOST_TEST(read.is_ok(), read.status().to_string());
    }
  }
}

BOOST_AUTO_TEST_CASE(any_change_but_whitespace_fails_the_checksum) {
  CheckpointMetadata m = sample_metadata(2, {"w"});
  m.objects["w"] = "plain";
  const std::string text = metadata_to_json(m);
  BOOST_REQUIRE(metadata_from_json(text, "metadata.json").is_ok());
  const auto checksum = nlohmann::json::parse(text)["checksum"].get<std::string>();
  std::string digit_changed = checksum;
  digit_changed[7] = digit_changed[7] == '0' ? '1' : '0';
  const std::vector<std::pair<std::string, std::string>> edits = {
      {"a member reordered",
       replace_first(text, "{\"size\": 1048576,\"xxh3\": \"000000000000002a\"}",
                     "{\"xxh3\": \"000000000000002a\",\"size\": 1048576}")},
      {"top-level members reordered",
       replace_first(replace_first(text, "\"step\": 7", "\"version\": 1"), "\"version\": 1\n}",
                     "\"step\": 7\n}")},
      {"a value changed", replace_first(text, "\"plain\"\n", "\"plaiN\"\n")},
      {"a digit of the checksum changed", replace_first(text, checksum, digit_changed)},
      {"a string escaped another way", replace_first(text, "\"plain\"\n", "\"pl\\u0061in\"\n")},
      {"the checksum's key escaped", replace_first(text, "\"checksum\"", "\"\\u0063hecksum\"")},
      {"a second checksum member",
       replace_first(text, "\n}", ",\n \"checksum\": \"" + checksum + "\"\n}")}};
  for (const auto& [what, edited] : edits) {
    BOOST_TEST_CONTEXT(what) {
      auto read = metadata_from_json(edited, "metadata.json");
      BOOST_TEST(is_checksum_mismatch(read), (read.is_ok() ? "read" : read.status().to_string()));
    }
  }
}

BOOST_AUTO_TEST_CASE(strings_that_look_like_json_round_trip_and_count) {
  // Quotes, backslashes, whitespace, escapes and a member "checksum" that is not the file's:
  // inside strings, as an object's name, and as an object's value.
  CheckpointMetadata m = sample_metadata(2, {"w"});
  const std::string fake = R"( "checksum": "0123456789abcdef", )";
  m.objects["checksum"] = "he said \"hi\",  \\ then\t\"checksum\":\n" + fake + " { } [ ] ,";
  m.objects[fake] = "\\\"" + fake + "\\";
  m.objects["w"] = "\"checksum\":";
  const std::string text = metadata_to_json(m);
  BOOST_TEST(metadata_text_checksum(text) == checksum_of_tree(text));
  auto read = metadata_from_json(text, "metadata.json");
  BOOST_REQUIRE_MESSAGE(read.is_ok(), read.status().to_string());
  BOOST_TEST((read->objects == m.objects));
  BOOST_TEST(metadata_to_json(*read) == text);
  auto reindented = metadata_from_json(nlohmann::json::parse(text).dump(3), "metadata.json");
  BOOST_TEST(reindented.is_ok(), reindented.status().to_string());
  // The object named "checksum" is hashed like any other: only the top-level member is not.
  auto tree = nlohmann::json::parse(text);
  tree["objects"]["checksum"] = "changed";
  BOOST_TEST(is_checksum_mismatch(metadata_from_json(tree.dump(1), "metadata.json")));
  tree = nlohmann::json::parse(text);
  tree["objects"][fake] = "changed";
  BOOST_TEST(is_checksum_mismatch(metadata_from_json(tree.dump(1), "metadata.json")));
}

BOOST_AUTO_TEST_CASE(a_field_outside_the_format_is_refused_and_named) {
  const std::string text = metadata_to_json(sample_metadata(2, {"w"}));
  for (const auto& [where, field] : std::vector<std::pair<std::string, std::string>>{
           {"/tensors/w", "tensors['w'].note"},
           {"/tensors/w/chunks/1", "tensors['w'].chunks[1].note"},
           {"/files/__0_0.safetensors", "files['__0_0.safetensors'].note"},
           {"", "note"}}) {
    auto j = nlohmann::json::parse(text);
    j[nlohmann::json::json_pointer(where)]["note"] = "added";
    auto m = metadata_from_json(j.dump(1), "metadata.json");
    BOOST_REQUIRE(!m.is_ok());
    BOOST_TEST(m.status().code() == ErrorCode::corruption);
    BOOST_TEST(
        m.status().message().find(field + " is not a field of the format") != std::string::npos,
        m.status().message());
  }
}

BOOST_AUTO_TEST_CASE(utf8_is_checked) {
  for (const std::string& good : kAwkwardNames)
    BOOST_TEST(is_valid_utf8(good), good);
  for (const std::string bad :
       {"\x80", "\xc3", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "a\xff"}) {
    BOOST_TEST(!is_valid_utf8(bad));
  }
  RankSaveReport report;
  report.objects["rng"] = "\xff";
  const std::vector<RankSaveReport> reports = {report};
  auto m = gather_reports(0, reports, 1, descriptors_by_rank({}));
  BOOST_REQUIRE(!m.is_ok());
  BOOST_TEST(m.status().message().find("UTF-8") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_part_holds_exactly_the_chunks_that_overlap_the_live_blocks) {
  // Saved split along either dimension into 1..13 parts, loaded split along either into 1..5.
  for (int saved_parts : {1, 2, 5, 13}) {
    const CheckpointMetadata m = sample_metadata(saved_parts, {"rows", "cols"});
    const MetadataIndex index(m);
    for (std::size_t live_dim : {0u, 1u}) {
      for (int live_parts : {1, 3, 5}) {
        for (int part = 0; part < live_parts; ++part) {
          StateDict state = live_block(m, part, live_parts, live_dim);
          state.objects["rows"] = "";
          const CheckpointMetadata got = index.part_for(state);
          BOOST_TEST(got.step == m.step);
          BOOST_TEST(got.objects.size() == 1u);
          std::set<std::string> files;
          for (const auto& live : state.tensors) {
            const TensorMeta& saved = m.tensors.at(live.desc.name);
            std::vector<std::size_t> expected = overlapping_by_scan(saved, live.desc);
            const auto& chunks = got.tensors.at(live.desc.name).chunks;
            BOOST_REQUIRE(chunks.size() == expected.size());
            for (std::size_t i = 0; i < expected.size(); ++i) {
              BOOST_TEST(chunks[i].offsets == saved.chunks[expected[i]].offsets);
              files.insert(chunks[i].file);
            }
          }
          BOOST_TEST(got.files.size() == files.size());
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_process_reads_a_metadata_file_once_until_it_changes) {
  TempDir dir;
  auto state = *make_synthetic_state({2, 64u << 10, 8, 3, 16}, 1, Device::host());
  auto other = *make_synthetic_state({2, 64u << 10, 8, 3, 16}, 0, Device::host());
  auto engine = *SaveEngine::create(1, {2, 0, false, {}});
  auto engine0 = *SaveEngine::create(0, {2, 0, false, {}});
  BOOST_REQUIRE(
      save_checkpoint_in_process(dir.path(), 1, {engine0.get(), engine.get()}, {&other, &state})
          .is_ok());
  const std::string ckpt = dir / "global_step_1";
  const std::string path = ckpt + "/policy/metadata.json";
  int reads = 0;
  auto read = [&]() -> Result<CheckpointMetadata> {
    ++reads;
    return read_checkpoint_metadata(ckpt);
  };
  FileSystem& fs = *local_file_system();
  auto first = shared_metadata_index(fs, path, read);
  auto second = shared_metadata_index(fs, path, read);
  BOOST_REQUIRE(first.is_ok());
  BOOST_TEST(reads == 1);
  BOOST_TEST(first->get() == second->get());
  // Rewritten with another step of the same length: read again.
  CheckpointMetadata changed = (*first)->metadata();
  changed.step = 2;
  std::ofstream(path) << metadata_to_json(changed);
  auto third = shared_metadata_index(fs, path, read);
  BOOST_TEST(reads == 2);
  BOOST_TEST(!third.is_ok());  // the folder is named for step 1
  // A file that cannot be identified (not there): read every time, cached never.
  BOOST_TEST(shared_metadata_index(fs, dir / "missing.json", read).status().code() == ErrorCode::corruption);
  BOOST_TEST(shared_metadata_index(fs, dir / "missing.json", read).status().code() == ErrorCode::corruption);
  BOOST_TEST(reads == 4);
}

BOOST_AUTO_TEST_CASE(a_loading_rank_gets_only_its_part) {
  TempDir dir;
  const SyntheticStateSpec spec{4, 64u << 10, 12, 5, 16};
  std::vector<StateDict> states;
  std::vector<std::unique_ptr<SaveEngine>> engines;
  for (int r = 0; r < spec.ranks; ++r) {
    states.push_back(*make_synthetic_state(spec, r, Device::host()));
    engines.push_back(*SaveEngine::create(r, {2, 0, false, {}}));
  }
  std::vector<SaveEngine*> engine_ptrs;
  std::vector<const StateDict*> state_ptrs;
  for (int r = 0; r < spec.ranks; ++r) {
    engine_ptrs.push_back(engines[static_cast<std::size_t>(r)].get());
    state_ptrs.push_back(&states[static_cast<std::size_t>(r)]);
  }
  BOOST_REQUIRE(save_checkpoint_in_process(dir.path(), 3, engine_ptrs, state_ptrs).is_ok());
  const std::string ckpt = dir / "global_step_3";
  auto full = *read_checkpoint_metadata(ckpt);
  auto part = read_checkpoint_metadata_part(*local_file_system(), ckpt, states[2]);
  BOOST_REQUIRE_MESSAGE(part.is_ok(), part.status().to_string());
  BOOST_TEST(part->tensors.size() == full.tensors.size());
  for (const auto& [name, t] : part->tensors) {
    // A tensor split across the 4 ranks: rank 2's chunk; a replicated one: its only chunk.
    BOOST_TEST(t.chunks.size() == 1u, name);
  }
  BOOST_TEST(part->objects.size() == 1u);
  BOOST_TEST(part->files.size() < full.files.size());
  auto loaded = *make_synthetic_state(spec, 2, Device::host());
  for (auto& t : loaded.tensors)
    std::fill_n(static_cast<std::uint8_t*>(t.tensor.data()), t.tensor.nbytes(), 0);
  BOOST_REQUIRE(load_checkpoint(ckpt, loaded).is_ok());
  for (std::size_t i = 0; i < loaded.tensors.size(); ++i) {
    BOOST_TEST(xxh3(loaded.tensors[i].tensor.data(), loaded.tensors[i].tensor.nbytes()) ==
               xxh3(states[2].tensors[i].tensor.data(), states[2].tensors[i].tensor.nbytes()));
  }
}

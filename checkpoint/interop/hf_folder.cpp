#include "stagehand/checkpoint/interop/hf_folder.hpp"

#include <nlohmann/json.hpp>

#include <set>

#include "stagehand/checkpoint/load/checkpoint_reader.hpp"

namespace stagehand {

Result<CheckpointMetadata> read_safetensors_folder(FileSystem& fs, const std::string& dir) {
  CheckpointMetadata m;
  std::map<std::string, std::string> index;  // tensor -> file, from the index
  std::vector<std::string> files;
  const std::string index_path = dir + "/" + kHfIndexFile;
  SH_ASSIGN_OR_RETURN(auto index_text, read_small_file(fs, index_path));
  if (index_text) {
    auto j = nlohmann::json::parse(*index_text, nullptr, false);
    auto map = j.is_object() ? j.find("weight_map") : j.end();
    if (map == j.end() || !map->is_object()) {
      return Status{ErrorCode::corruption,
                    "'" + index_path + "': field 'weight_map' is missing or not an object"};
    }
    std::set<std::string> seen;
    for (const auto& [tensor, file] : map->items()) {
      if (!file.is_string() || !is_plain_file_name(file.get<std::string>())) {
        return Status{ErrorCode::corruption, "'" + index_path + "': weight_map['" + tensor +
                                                 "'] is not the name of a file in the folder"};
      }
      index[tensor] = file.get<std::string>();
      if (seen.insert(file.get<std::string>()).second) files.push_back(file.get<std::string>());
    }
  } else {
    files.push_back(kHfSingleFile);
  }
  for (const auto& name : files) {
    const std::string path = dir + "/" + name;
    SH_ASSIGN_OR_RETURN(auto file, fs.open_file(path));
    SH_ASSIGN_OR_RETURN(ParsedSafetensors header, read_safetensors_header(*file, path));
    m.files[name] = FileMeta{file->size(), 0};
    for (const auto& e : header.entries) {
      if (m.tensors.count(e.key) != 0) {
        return Status{ErrorCode::corruption, "tensor '" + e.key + "' is in '" + path +
                                                 "' and in '" +
                                                 m.tensors[e.key].chunks.front().file + "'"};
      }
      if (index_text && index.count(e.key) != 0 && index[e.key] != name) {
        return Status{ErrorCode::corruption, "'" + index_path + "' puts tensor '" + e.key +
                                                 "' in '" + index[e.key] + "', but it is in '" +
                                                 path + "'"};
      }
      ChunkMeta chunk{Shape::zeros(e.shape.rank()), e.shape, name, header.data_start + e.begin,
                      header.data_start + e.end,    0};
      m.tensors[e.key] = TensorMeta{e.dtype, e.shape, {chunk}};
    }
  }
  for (const auto& [tensor, file] : index) {
    if (m.tensors.count(tensor) == 0) {
      return Status{ErrorCode::corruption, "'" + index_path + "' names tensor '" + tensor +
                                               "' in '" + file + "', which does not hold it"};
    }
  }
  return m;
}

}  // namespace stagehand

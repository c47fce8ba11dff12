#include "stagehand/storage/file_system.hpp"

namespace stagehand {

Status ReadableFile::read_vectored(std::uint64_t offset, const std::vector<ReadSegment>& segments) {
  for (const auto& s : segments) {
    SH_RETURN_IF_ERROR(read(offset, s.dst, s.bytes));
    offset += s.bytes;
  }
  return Status::ok();
}

std::string parent_path(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/')
    p.pop_back();
  const auto slash = p.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  // "s3://bucket" has no parent folder inside the store: it is the root.
  if (p.compare(slash - 1, 2, "//") == 0) return p;
  return p.substr(0, slash);
}

bool path_within(const std::string& path, const std::string& folder) {
  if (folder == "/") return path.starts_with("/");
  if (!path.starts_with(folder)) return false;
  return path.size() == folder.size() || path[folder.size()] == '/';
}

Status create_dirs(FileSystem& fs, const std::string& path) {
  SH_ASSIGN_OR_RETURN(bool exists, fs.is_dir(path));
  if (exists) return Status::ok();
  const std::string parent = parent_path(path);
  if (parent != path && parent != "." && parent != "/") SH_RETURN_IF_ERROR(create_dirs(fs, parent));
  return fs.create_dir(path);
}

Result<bool> file_exists(FileSystem& fs, const std::string& path) {
  SH_ASSIGN_OR_RETURN(auto version, fs.stat_file(path));
  return version.has_value();
}

Result<std::optional<std::string>> read_small_file(FileSystem& fs, const std::string& path) {
  auto file = fs.open_file(path);
  if (!file.is_ok()) {
    if (file.status().code() == ErrorCode::not_found) return std::optional<std::string>{};
    return file.status();
  }
  std::string out((*file)->size(), '\0');
  SH_RETURN_IF_ERROR((*file)->read(0, out.data(), out.size()));
  return std::optional<std::string>{std::move(out)};
}

Status write_file_atomic(FileSystem& fs, const std::string& path,
                         const std::function<Status(WritableFile&)>& fill) {
  if (!fs.capabilities(path).atomic_rename) {
    // One upload: the object appears whole or not at all.
    SH_ASSIGN_OR_RETURN(auto file, fs.create_file(path));
    SH_RETURN_IF_ERROR(fill(*file));
    SH_RETURN_IF_ERROR(file->sync());
    return file->close();
  }
  const std::string tmp = path + ".tmp";
  Status st = [&]() -> Status {
    SH_ASSIGN_OR_RETURN(auto file, fs.create_file(tmp));
    SH_RETURN_IF_ERROR(fill(*file));
    SH_RETURN_IF_ERROR(file->sync());
    SH_RETURN_IF_ERROR(file->close());
    return fs.rename(tmp, path);
  }();
  if (!st.is_ok()) {
    (void)fs.remove_file(tmp);
    return st;
  }
  return fs.sync_dir(parent_path(path));
}

Status write_file_atomic(FileSystem& fs, const std::string& path, const std::string& content) {
  return write_file_atomic(
      fs, path, [&](WritableFile& file) { return file.append(content.data(), content.size()); });
}

}  // namespace stagehand

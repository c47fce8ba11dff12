#include "stagehand/checkpoint/writer.hpp"

#include <algorithm>

#include "stagehand/checkpoint/format.hpp"

namespace stagehand {

namespace {

constexpr std::size_t kWriteSize = 64u << 20;

}  // namespace

Result<std::unique_ptr<WritableFile>> open_bucket_file(StorageBackend& storage, const std::string& dir,
                                                       const PlannedBucket& bucket) {
  SH_ASSIGN_OR_RETURN(auto file, storage.open_for_write(dir + "/" + bucket.file_name));
  SH_RETURN_IF_ERROR(file->append(bucket.header.data(), bucket.header.size()));
  return file;
}

Status write_bucket_items(WritableFile& file, const PlannedBucket& bucket, std::size_t first, std::size_t last,
                          const std::uint8_t* data, std::vector<ChunkRecord>& chunks) {
  for (std::size_t i = first; i < last; ++i) {
    const PlannedItem& item = bucket.items[i];
    const std::uint8_t* chunk = data + item.data_offset;
    const std::uint64_t begin = bucket.header.size() + item.data_offset;
    chunks[i] = {item.desc, begin, begin + item.nbytes, xxh3(chunk, item.nbytes)};
    for (std::uint64_t done = 0; done < item.nbytes;) {
      auto n = static_cast<std::size_t>(std::min<std::uint64_t>(kWriteSize, item.nbytes - done));
      SH_RETURN_IF_ERROR(file.write_at(begin + done, chunk + done, n));
      done += n;
    }
  }
  return Status::ok();
}

std::uint64_t bucket_file_xxh3(const PlannedBucket& bucket, const std::uint8_t* data) {
  Xxh3Stream hash;
  hash.update(bucket.header.data(), bucket.header.size());
  if (bucket.data_bytes > 0) hash.update(data, bucket.data_bytes);
  return hash.digest();
}

std::vector<std::size_t> split_items(const PlannedBucket& bucket, int parts) {
  std::vector<std::size_t> bounds{0};
  std::uint64_t done = 0;
  for (std::size_t i = 0; i < bucket.items.size(); ++i) {
    done += bucket.items[i].nbytes;
    // Cut after item i once this part has its share of the bytes.
    auto cut = bucket.data_bytes * bounds.size() / static_cast<std::uint64_t>(parts);
    if (done >= cut && static_cast<int>(bounds.size()) < parts && i + 1 < bucket.items.size()) bounds.push_back(i + 1);
  }
  bounds.push_back(bucket.items.size());
  return bounds;
}

void finish_bucket(int rank, std::unique_ptr<WritableFile> file, BucketWriteResult& result) {
  Status st = file->sync();
  if (st.is_ok()) st = file->close();
  if (!st.is_ok() && result.status.is_ok()) {
    result.status = st.with_context("rank " + std::to_string(rank) + " bucket " + std::to_string(result.bucket));
  }
}

}  // namespace stagehand

#include "strategy/writer.hpp"

#include <algorithm>

#include "strategy/format.hpp"

namespace stagehand {

namespace {

constexpr std::size_t kWriteSize = 64u << 20;

}  // namespace

BucketWriteResult write_bucket(StorageBackend& storage, const std::string& dir, int rank,
                               const PlannedBucket& bucket, const std::uint8_t* data,
                               std::unique_ptr<WritableFile>* unsynced) {
  BucketWriteResult result;
  result.bucket = bucket.index;
  result.file = bucket.file_name;
  std::string path = dir + "/" + bucket.file_name;
  std::string context = "rank " + std::to_string(rank) + " bucket " + std::to_string(bucket.index);
  auto fail = [&](const Status& st) {
    result.status = st.with_context(context);
    return result;
  };

  auto opened = storage.open_for_write(path);
  if (!opened.is_ok()) return fail(opened.status());
  auto& file = *opened;
  Xxh3Stream file_hash;
  file_hash.update(bucket.header.data(), bucket.header.size());
  Status st = file->append(bucket.header.data(), bucket.header.size());
  if (!st.is_ok()) return fail(st);
  for (const auto& item : bucket.items) {
    const std::uint8_t* chunk = data + item.data_offset;
    std::uint64_t begin = bucket.header.size() + item.data_offset;
    result.chunks.push_back({item.desc, begin, begin + item.nbytes, xxh3(chunk, item.nbytes)});
    for (std::uint64_t done = 0; done < item.nbytes;) {
      std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kWriteSize, item.nbytes - done));
      file_hash.update(chunk + done, n);
      st = file->append(chunk + done, n);
      if (!st.is_ok()) return fail(st);
      done += n;
    }
  }
  result.size = bucket.file_size();
  result.xxh3 = file_hash.digest();
  if (unsynced != nullptr) {
    *unsynced = std::move(file);
    return result;
  }
  finish_bucket(rank, std::move(file), result);
  return result;
}

void finish_bucket(int rank, std::unique_ptr<WritableFile> file, BucketWriteResult& result) {
  Status st = file->sync();
  if (st.is_ok()) st = file->close();
  if (!st.is_ok() && result.status.is_ok()) {
    result.status = st.with_context("rank " + std::to_string(rank) + " bucket " + std::to_string(result.bucket));
  }
}

}  // namespace stagehand

#include "stagehand/checkpoint/writer.hpp"

namespace stagehand {

Result<std::unique_ptr<WritableFile>> open_bucket_file(FileSystem& fs, const std::string& dir,
                                                       const PlannedBucket& bucket) {
  SH_ASSIGN_OR_RETURN(auto file, fs.create_file(dir + "/" + bucket.file_name));
  SH_RETURN_IF_ERROR(file->append(bucket.header.data(), bucket.header.size()));
  return file;
}

BucketHasher::BucketHasher(const PlannedBucket& bucket, std::vector<ChunkRecord>& chunks)
    : bucket_(bucket), chunks_(chunks) {
  chunks_.assign(bucket.items.size(), ChunkRecord{});
  for (std::size_t i = 0; i < bucket.items.size(); ++i) {
    const PlannedItem& item = bucket.items[i];
    const std::uint64_t begin = bucket.header.size() + item.data_offset;
    chunks_[i] = {item.desc, begin, begin + item.nbytes, 0};
  }
  file_.update(bucket.header.data(), bucket.header.size());
  close_finished_items();
}

void BucketHasher::close_finished_items() {
  while (next_item_ < bucket_.items.size()) {
    const PlannedItem& item = bucket_.items[next_item_];
    if (item.data_offset + item.nbytes > consumed_) return;
    chunks_[next_item_].xxh3 = item_.digest();
    item_.reset();
    ++next_item_;
  }
}

void BucketHasher::consume(const std::uint8_t* data, std::size_t bytes) {
  file_.update(data, bytes);
  while (bytes > 0 && next_item_ < bucket_.items.size()) {
    const PlannedItem& item = bucket_.items[next_item_];
    auto n = static_cast<std::size_t>(std::min<std::uint64_t>(bytes, item.data_offset + item.nbytes - consumed_));
    item_.update(data, n);
    data += n;
    bytes -= n;
    consumed_ += n;
    close_finished_items();
  }
}

Status write_and_start_writeback(WritableFile& file, std::uint64_t offset, const std::uint8_t* data,
                                 std::size_t bytes, bool early_writeback) {
  SH_RETURN_IF_ERROR(file.write_at(offset, data, bytes));
  return early_writeback ? file.start_writeback(offset, bytes) : Status::ok();
}

}  // namespace stagehand

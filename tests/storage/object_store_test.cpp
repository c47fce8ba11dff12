#define BOOST_TEST_MODULE object_store
#include <boost/test/unit_test.hpp>

#include <set>
#include <thread>

#include "stagehand/storage/object_store.hpp"
#include "tests/s3_test_util.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;
using namespace stagehand::test;

namespace {

std::string pattern_bytes(std::size_t n, std::uint32_t seed) {
  std::string s(n, '\0');
  std::mt19937 gen(seed);
  for (auto& c : s) c = static_cast<char>(gen());
  return s;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::shared_ptr<Bucket> open_bucket(const ObjectStoreOptions& o, const std::string& name = "ckpt-bucket") {
  auto bucket = Bucket::open(DestinationKind::s3, name, o);
  BOOST_REQUIRE_MESSAGE(bucket.is_ok(), bucket.status().message());
  return *bucket;
}

}  // namespace

BOOST_AUTO_TEST_CASE(urls_parse_and_reject_bad_keys) {
  auto u = ObjectUrl::parse("s3://my-bucket/runs/exp_1/");
  BOOST_REQUIRE(u.is_ok());
  BOOST_TEST(u->bucket == "my-bucket");
  BOOST_TEST(u->key == "runs/exp_1");
  BOOST_TEST(u->str() == "s3://my-bucket/runs/exp_1");
  BOOST_TEST(u->key_of("global_step_3") == "runs/exp_1/global_step_3");
  auto g = ObjectUrl::parse("gs://bkt");
  BOOST_REQUIRE(g.is_ok());
  BOOST_TEST((g->kind == DestinationKind::gcs));
  BOOST_TEST(g->key.empty());
  BOOST_TEST(ObjectUrl::parse("s3://x/a").status().message().find("bucket name") != std::string::npos);
  BOOST_TEST(ObjectUrl::parse("s3://bucket/a b").status().message().find("' '") != std::string::npos);
  BOOST_TEST(ObjectUrl::parse("s3://bucket/a//b").status().message().find("empty path segment") != std::string::npos);
  BOOST_TEST(!ObjectUrl::parse("/local/path").is_ok());
}

BOOST_AUTO_TEST_CASE(options_check_credentials_and_sizes) {
  ObjectStoreOptions o;
  auto none = Bucket::open(DestinationKind::s3, "bkt", o);
  BOOST_TEST((none.status().code() == ErrorCode::permission_denied));
  BOOST_TEST(none.status().message().find("AWS_ACCESS_KEY_ID") != std::string::npos);
  o.access_key_id = "a";
  o.secret_access_key = "b";
  o.part_size = 1 << 20;
  BOOST_TEST(Bucket::open(DestinationKind::s3, "bkt", o).status().message().find("5 MiB") != std::string::npos);
  o.part_size = 8 << 20;
  o.endpoint = "ftp://x";
  BOOST_TEST(Bucket::open(DestinationKind::s3, "bkt", o).status().message().find("http://") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(put_get_range_list_remove) {
  S3Server server({"ckpt-bucket"});
  auto bucket = open_bucket(server.options());
  BOOST_REQUIRE(bucket->check_access("").is_ok());
  std::string data = pattern_bytes(100000, 1);
  BOOST_REQUIRE(bucket->put("a/one.bin", data).is_ok());
  BOOST_REQUIRE(bucket->put("a/two.txt", "hello").is_ok());
  BOOST_REQUIRE(bucket->put("b/three", "x").is_ok());
  auto size = bucket->size_of("a/one.bin");
  BOOST_REQUIRE(size.is_ok());
  BOOST_TEST(size->value() == data.size());
  BOOST_TEST(!bucket->size_of("a/missing")->has_value());
  auto text = bucket->get("a/two.txt");
  BOOST_REQUIRE(text.is_ok() && text->has_value());
  BOOST_TEST(**text == "hello");
  BOOST_TEST(!bucket->get("a/missing")->has_value());
  std::string part(777, '\0');
  BOOST_REQUIRE(bucket->get_range("a/one.bin", 12345, part.size(), part.data()).is_ok());
  BOOST_TEST((part == data.substr(12345, 777)));
  Status past_end = bucket->get_range("a/one.bin", data.size() - 10, 20, part.data());
  BOOST_TEST(!past_end.is_ok());
  auto listed = bucket->list("a/");
  BOOST_REQUIRE(listed.is_ok());
  BOOST_REQUIRE(listed->size() == 2u);
  BOOST_TEST((*listed)[0].key == "a/one.bin");
  BOOST_TEST((*listed)[0].size == data.size());
  BOOST_REQUIRE(bucket->remove("a/one.bin").is_ok());
  BOOST_REQUIRE(bucket->remove("a/never-there").is_ok());
  BOOST_TEST(bucket->list("a/")->size() == 1u);
}

BOOST_AUTO_TEST_CASE(multipart_uploads_come_back_byte_identical) {
  S3Server server({"ckpt-bucket"});
  auto o = server.options();
  o.multipart_threshold = 8 << 20;
  o.part_size = 5 << 20;
  o.upload_threads = 3;
  auto bucket = open_bucket(o);
  TempDir dir;
  std::string big = pattern_bytes((12 << 20) + 12345, 2);
  std::string small = pattern_bytes(4096, 3);
  write_bytes(dir / "big", big);
  write_bytes(dir / "small", small);
  BOOST_REQUIRE(bucket->upload_files({{dir / "big", "up/big"}, {dir / "small", "up/small"}}).is_ok());
  auto back = bucket->get("up/big");
  BOOST_REQUIRE(back.is_ok() && back->has_value());
  BOOST_TEST(((**back) == big));
  BOOST_TEST((**bucket->get("up/small") == small));
  BOOST_TEST(bucket->open_uploads("up/")->empty());
  // The server's own listing: one object per file, not parts.
  BOOST_TEST(server.command("uploads ckpt-bucket") == "[]");
}

BOOST_AUTO_TEST_CASE(wrong_credentials_missing_bucket_and_unreachable_endpoint_differ) {
  S3Server server({"ckpt-bucket"});
  auto wrong_secret = server.options();
  wrong_secret.secret_access_key = "not-the-secret";
  Status st = open_bucket(wrong_secret)->check_access("");
  BOOST_TEST((st.code() == ErrorCode::permission_denied));
  BOOST_TEST(st.message().find("SignatureDoesNotMatch") != std::string::npos, st.message());
  BOOST_TEST(st.message().find("AWS_SECRET_ACCESS_KEY") != std::string::npos);

  auto unknown_key = server.options();
  unknown_key.access_key_id = "AKIAUNKNOWNKEY000000";
  st = open_bucket(unknown_key)->check_access("");
  BOOST_TEST((st.code() == ErrorCode::permission_denied));
  BOOST_TEST(st.message().find("InvalidAccessKeyId") != std::string::npos, st.message());

  st = open_bucket(server.options(), "no-such-bucket")->check_access("");
  BOOST_TEST((st.code() == ErrorCode::not_found));
  BOOST_TEST(st.message().find("bucket 'no-such-bucket' does not exist") != std::string::npos, st.message());

  auto nowhere = server.options();
  nowhere.endpoint = "http://127.0.0.1:1";
  st = open_bucket(nowhere)->check_access("");
  BOOST_TEST((st.code() == ErrorCode::io_error));
  BOOST_TEST(st.message().find("cannot reach the object store at http://127.0.0.1:1") != std::string::npos,
             st.message());
  BOOST_TEST(st.message().find("gave up after 4 attempts") != std::string::npos, st.message());
}

BOOST_AUTO_TEST_CASE(requests_are_retried_until_the_server_is_back) {
  S3Server server({"ckpt-bucket"}, /*proxy=*/true);
  auto o = server.options(/*through_proxy=*/true);
  o.max_attempts = 8;
  o.initial_backoff_s = 0.2;
  o.max_backoff_s = 0.4;
  auto bucket = open_bucket(o);
  BOOST_REQUIRE(server.command("down") == "ok");
  std::thread back([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    server.command("up");
  });
  Status st = bucket->put("r/after-outage", "still here");
  back.join();
  BOOST_TEST(st.is_ok(), st.message());
  BOOST_TEST(**bucket->get("r/after-outage") == "still here");
}

BOOST_AUTO_TEST_CASE(a_multipart_upload_cut_off_by_a_dead_server_is_named_and_can_be_aborted_later) {
  S3Server server({"ckpt-bucket"}, /*proxy=*/true);
  auto o = server.options(/*through_proxy=*/true);
  o.multipart_threshold = 5 << 20;
  o.part_size = 5 << 20;
  o.upload_threads = 1;
  o.max_attempts = 2;
  auto failing = open_bucket(o);
  auto direct = open_bucket(server.options());
  TempDir dir;
  write_bytes(dir / "big", pattern_bytes(16 << 20, 4));
  // The server goes away in the middle of the second part and stays away.
  BOOST_REQUIRE(server.command("down_after 7000000") == "ok");
  Status st = failing->upload_files({{dir / "big", "m/big"}});
  BOOST_TEST((st.code() == ErrorCode::io_error));
  BOOST_TEST(st.message().find("upload part 2 of 's3://ckpt-bucket/m/big'") != std::string::npos, st.message());
  BOOST_TEST(st.message().find("gave up after 2 attempts") != std::string::npos, st.message());
  BOOST_TEST(st.message().find("is left open") != std::string::npos, st.message());
  BOOST_REQUIRE(server.command("up") == "ok");
  BOOST_TEST(!direct->size_of("m/big")->has_value());
  auto open = direct->open_uploads("m/");
  BOOST_REQUIRE(open.is_ok());
  BOOST_REQUIRE(open->size() == 1u);
  BOOST_TEST(st.message().find((*open)[0].upload_id) != std::string::npos);
  BOOST_REQUIRE(direct->abort_upload((*open)[0]).is_ok());
  BOOST_TEST(direct->open_uploads("m/")->empty());
}

BOOST_AUTO_TEST_CASE(open_uploads_are_listed_page_after_page) {
  S3Server server({"ckpt-bucket"});
  auto bucket = open_bucket(server.options());
  // Five open uploads under pg/ (one key twice), answered two at a time as S3 answers 1000.
  for (const char* key : {"pg/a", "pg/b", "pg/b", "pg/c", "pg/d"}) {
    BOOST_REQUIRE(server.command(std::string("open_upload ckpt-bucket ") + key) == "ok");
  }
  BOOST_REQUIRE(server.command("open_upload ckpt-bucket other/x") == "ok");
  BOOST_REQUIRE(server.command("uploads_page 2") == "ok");
  auto open = bucket->open_uploads("pg/");
  BOOST_REQUIRE_MESSAGE(open.is_ok(), open.status().to_string());
  BOOST_TEST(open->size() == 5u);
  std::set<std::string> ids;
  for (const auto& u : *open) {
    BOOST_TEST(u.key.rfind("pg/", 0) == 0u, u.key);
    ids.insert(u.upload_id);
  }
  BOOST_TEST(ids.size() == 5u);
  for (const auto& u : *open) BOOST_REQUIRE(bucket->abort_upload(u).is_ok());
  BOOST_TEST(bucket->open_uploads("pg/")->empty());
  BOOST_TEST(bucket->open_uploads("other/")->size() == 1u);
}

#define BOOST_TEST_MODULE process_world
#include <boost/test/unit_test.hpp>
#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <cstdlib>
#include <future>
#include <thread>

#include "stagehand/actors/launch.hpp"
#include "stagehand/actors/messages.hpp"
#include "stagehand/actors/process_world.hpp"
#include "stagehand/strategy/messages.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;

namespace {

struct Env {
  std::vector<std::string> names;
  void set(const std::string& name, const std::string& value) {
    ::setenv(name.c_str(), value.c_str(), 1);
    names.push_back(name);
  }
  ~Env() {
    for (const auto& n : names) ::unsetenv(n.c_str());
  }
};

caf::actor_system_config& wire_config(caf::actor_system_config& cfg) {
  register_stagehand_errors(cfg);
  register_wire_types(cfg);
  return cfg;
}

/// Rank 0 of a world of 2 on a free port, gathering in the background with `local` as its own
/// Workers; it shuts down with `exit_code` and closes its port when the test ends.
struct Rank0 {
  caf::actor_system_config cfg;
  caf::actor_system system{wire_config(cfg)};
  LaunchInfo info;
  std::unique_ptr<WorldHost> host;
  std::future<Result<std::vector<worker_actor>>> gathered;
  int exit_code = 1;

  explicit Rank0(std::vector<worker_actor> local, std::string job = "") {
    info.world_size = 2;
    info.master_port = test::free_port();
    info.join_timeout = std::chrono::seconds(10);
    info.job = std::move(job);
    auto opened = WorldHost::open(system, info);
    BOOST_REQUIRE_MESSAGE(opened.is_ok(), opened.status().to_string());
    host = std::move(*opened);
    gathered = std::async(std::launch::async, [this, local = std::move(local)] {
      return host->gather(local, caf::actor{}, coordinator_actor{});
    });
  }
  ~Rank0() {
    if (gathered.valid()) gathered.wait();
    host->shutdown(exit_code);
    host.reset();
    system.middleman().close(static_cast<std::uint16_t>(info.master_port));
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(descriptors_of_every_rank_cross_the_wire_unchanged) {
  // Shapes of up to kInlineRank dimensions are held in place and longer ones on the heap; both
  // travel as kMaxRank dimensions and a rank.
  caf::actor_system_config cfg;
  caf::actor_system system{wire_config(cfg)};
  std::vector<ShardedTensorDesc> sent;
  for (std::size_t rank : {0u, 1u, 4u, 5u, 8u}) {
    ShardedTensorDesc d;
    d.name = "t" + std::to_string(rank);
    std::vector<std::int64_t> dims(rank, 3), offsets(rank, 1), local(rank, 2);
    d.global_shape = Shape(std::span<const std::int64_t>(dims));
    d.global_offset = Shape(std::span<const std::int64_t>(offsets));
    d.local_shape = Shape(std::span<const std::int64_t>(local));
    d.replica_id = static_cast<std::int32_t>(rank);
    sent.push_back(d);
  }
  std::vector<char> bytes;
  caf::binary_serializer out{system, bytes};
  BOOST_REQUIRE(!out(sent));
  std::vector<ShardedTensorDesc> got;
  caf::binary_deserializer in{system, bytes};
  BOOST_REQUIRE(!in(got));
  BOOST_TEST((got == sent));
  BOOST_TEST(got.back().local_shape.to_string() == "[2, 2, 2, 2, 2, 2, 2, 2]");
}

BOOST_AUTO_TEST_CASE(launch_info_comes_from_the_launcher_variables_and_flags) {
  {
    auto none = read_launch_info({});
    BOOST_REQUIRE(none.is_ok());
    BOOST_TEST(!none->multi_process());
  }
  Env env;
  env.set("WORLD_SIZE", "4");
  env.set("RANK", "3");
  env.set("MASTER_ADDR", "10.0.0.7");
  env.set("MASTER_PORT", "29611");
  auto info = read_launch_info({});
  BOOST_REQUIRE(info.is_ok());
  BOOST_TEST(info->multi_process());
  BOOST_TEST(info->rank == 3);
  BOOST_TEST(info->local_rank == 3);
  BOOST_TEST(info->master() == "10.0.0.7:29611");
  LaunchFlags flags;
  flags.rank = 1;
  flags.master_port = 4000;
  auto overridden = read_launch_info(flags);
  BOOST_REQUIRE(overridden.is_ok());
  BOOST_TEST(overridden->rank == 1);
  BOOST_TEST(overridden->master_port == 4000);
  env.set("RANK", "4");
  BOOST_TEST(read_launch_info({}).status().message().find("RANK=4 must be below WORLD_SIZE=4") != std::string::npos);
  env.set("RANK", "x1");
  BOOST_TEST(read_launch_info({}).status().message().find("RANK='x1' is not a non-negative integer") !=
             std::string::npos);
  env.set("RANK", "0");
  env.set("MASTER_PORT", "70000");
  BOOST_TEST(read_launch_info({}).status().message().find("not a TCP port") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_process_speaking_another_wire_version_is_refused_with_both_versions_named) {
  caf::actor_system_config member_cfg;
  caf::actor_system member_system{wire_config(member_cfg)};
  Rank0 rank0({});

  LaunchInfo old = rank0.info;
  old.rank = 1;
  old.wire_version = "stagehand-wire/0";
  auto start = std::chrono::steady_clock::now();
  Result<JoinedWorld> joined = Status{ErrorCode::internal, "not run"};
  {
    WorldMember member(member_system, old);
    joined = member.join({worker_actor{}});
  }
  BOOST_TEST(!joined.is_ok());
  BOOST_TEST(joined.status().message().find("speaks stagehand-wire/0, rank 0 speaks stagehand-wire/4") !=
                 std::string::npos,
             joined.status().message());
  auto world = rank0.gathered.get();
  BOOST_TEST(!world.is_ok());
  BOOST_TEST(world.status().message().find("stagehand-wire/0") != std::string::npos, world.status().message());
  BOOST_TEST((std::chrono::steady_clock::now() - start < std::chrono::seconds(5)));
}

BOOST_AUTO_TEST_CASE(a_process_of_another_job_on_the_same_port_is_refused_and_the_job_still_starts) {
  // Two jobs on one host, both on the default port: the other job's rank 1 reaches this job's
  // rank 0 first. It was taken as this job's rank 1 (two jobs' shards in one checkpoint), and
  // this job's own rank 1 then failed the start.
  caf::actor_system_config other_cfg;
  caf::actor_system other_system{wire_config(other_cfg)};
  caf::actor_system_config member_cfg;
  caf::actor_system member_system{wire_config(member_cfg)};
  Rank0 rank0({worker_actor{}}, "/ckpt/job-a");
  const LaunchInfo& info = rank0.info;

  LaunchInfo other = info;
  other.rank = 1;
  other.job = "/ckpt/job-b";
  Result<JoinedWorld> refused = Status{ErrorCode::internal, "not run"};
  {
    WorldMember stranger(other_system, other);
    refused = stranger.join({worker_actor{}});
  }
  BOOST_TEST(!refused.is_ok());
  BOOST_TEST(refused.status().message().find("belongs to another job ('/ckpt/job-b'; rank 0 at " + info.master() +
                                             " runs '/ckpt/job-a')") != std::string::npos,
             refused.status().message());

  LaunchInfo mine = info;
  mine.rank = 1;
  Result<JoinedWorld> joined = Status{ErrorCode::internal, "not run"};
  WorldMember member(member_system, mine);
  joined = member.join({worker_actor{}});
  BOOST_TEST(joined.is_ok(), joined.status().to_string());
  auto world = rank0.gathered.get();
  BOOST_TEST(world.is_ok(), world.status().to_string());
  member.leave();
  rank0.exit_code = 0;
}

BOOST_AUTO_TEST_CASE(a_join_of_the_previous_wire_shape_is_refused_naming_its_version) {
  // stagehand-wire/3 joined without the job; such a message matched no handler and was dropped,
  // and rank 0 failed only at its join limit, saying nothing of the version.
  caf::actor_system_config old_cfg;
  caf::actor_system old_system{wire_config(old_cfg)};
  Rank0 rank0({worker_actor{}});
  auto world = connect_remote_actor(old_system, "127.0.0.1", static_cast<std::uint16_t>(rank0.info.master_port),
                                    std::chrono::seconds(5));
  BOOST_REQUIRE_MESSAGE(world.is_ok(), world.status().to_string());
  std::string refused;
  {
    caf::scoped_actor self{old_system};
    self->send(*world, join_atom::value, std::int32_t{1}, std::int32_t{2}, std::string("stagehand-wire/3"),
               std::vector<worker_actor>{worker_actor{}});
    self->receive([&](join_error_atom, const std::string& why) { refused = why; },
                  caf::after(std::chrono::seconds(5)) >> [&] { refused = "no answer within 5 s"; });
  }
  BOOST_TEST(refused.find("speaks stagehand-wire/3, rank 0 speaks stagehand-wire/4") != std::string::npos, refused);
  BOOST_TEST(!rank0.gathered.get().is_ok());
}

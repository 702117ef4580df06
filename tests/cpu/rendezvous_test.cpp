// The launch environment and rank 0's TCP rendezvous, with threads as ranks on localhost: the
// variables torchrun and mpirun set (and the port torchrun's own store holds), one clear line for
// each missing or malformed one, the blob reaching every rank whatever order they start in, and
// the deadline's errors naming who is missing.
#include "dp/rendezvous.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace fusekit::dp {
namespace {

using std::chrono::milliseconds;

LaunchEnvironment read(const std::map<std::string, std::string>& variables) {
  return read_launch_environment([&](const char* name) -> std::optional<std::string> {
    auto it = variables.find(name);
    return it == variables.end() ? std::nullopt : std::optional<std::string>(it->second);
  });
}

// The message of the std::runtime_error that `f` throws ("" if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

// A port that was free a moment ago (bound to port 0, then released).
uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  socklen_t length = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

LaunchEnvironment rank_of(int rank, int world, uint16_t port, milliseconds timeout) {
  LaunchEnvironment launch;
  launch.rank = rank;
  launch.world_size = world;
  launch.local_rank = rank;
  launch.master_addr = "localhost";
  launch.port = port;
  launch.timeout = timeout;
  return launch;
}

TEST(LaunchEnvironment, NothingSetIsOneRankAlone) {
  const LaunchEnvironment launch = read({});
  EXPECT_EQ(launch.rank, 0);
  EXPECT_EQ(launch.world_size, 1);
  EXPECT_EQ(launch.local_rank, 0);
  EXPECT_EQ(launch.launcher, "single");
  EXPECT_EQ(launch.port, 0);
}

TEST(LaunchEnvironment, TorchrunTakesThePortAfterItsAgentStore) {
  const LaunchEnvironment launch = read({{"RANK", "3"},
                                         {"WORLD_SIZE", "4"},
                                         {"LOCAL_RANK", "1"},
                                         {"MASTER_ADDR", "node0"},
                                         {"MASTER_PORT", "29500"},
                                         {"TORCHELASTIC_RUN_ID", "none"},
                                         {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  EXPECT_EQ(launch.rank, 3);
  EXPECT_EQ(launch.world_size, 4);
  EXPECT_EQ(launch.local_rank, 1);
  EXPECT_EQ(launch.master_addr, "node0");
  EXPECT_EQ(launch.port, 29501);
  EXPECT_EQ(launch.launcher, "torchrun");
  EXPECT_EQ(launch.timeout, std::chrono::seconds(300));
  // Without the agent's store (an older torchrun, or another launcher): MASTER_PORT itself.
  EXPECT_EQ(read({{"RANK", "0"},
                  {"WORLD_SIZE", "2"},
                  {"LOCAL_RANK", "0"},
                  {"MASTER_ADDR", "node0"},
                  {"MASTER_PORT", "29500"},
                  {"TORCHELASTIC_USE_AGENT_STORE", "False"}})
                .port,
            29500);
  // FUSEKIT_RENDEZVOUS_PORT overrides both; the timeout is read in seconds.
  const LaunchEnvironment overridden = read({{"RANK", "0"},
                                             {"WORLD_SIZE", "2"},
                                             {"LOCAL_RANK", "0"},
                                             {"MASTER_ADDR", "node0"},
                                             {"MASTER_PORT", "29500"},
                                             {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                             {"FUSEKIT_RENDEZVOUS_PORT", "40000"},
                                             {"FUSEKIT_RENDEZVOUS_TIMEOUT", "20"}});
  EXPECT_EQ(overridden.port, 40000);
  EXPECT_EQ(overridden.timeout, std::chrono::seconds(20));
}

TEST(LaunchEnvironment, MpirunVariablesAreTheFallback) {
  const LaunchEnvironment launch = read({{"OMPI_COMM_WORLD_RANK", "5"},
                                         {"OMPI_COMM_WORLD_SIZE", "8"},
                                         {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                         {"MASTER_ADDR", "10.0.0.2"},
                                         {"MASTER_PORT", "12345"}});
  EXPECT_EQ(launch.rank, 5);
  EXPECT_EQ(launch.world_size, 8);
  EXPECT_EQ(launch.local_rank, 1);
  EXPECT_EQ(launch.port, 12345);
  EXPECT_EQ(launch.launcher, "mpirun");
  // torchrun's names win where both are set.
  EXPECT_EQ(read({{"RANK", "2"},
                  {"OMPI_COMM_WORLD_RANK", "5"},
                  {"WORLD_SIZE", "4"},
                  {"OMPI_COMM_WORLD_SIZE", "8"},
                  {"LOCAL_RANK", "0"},
                  {"MASTER_ADDR", "a"},
                  {"MASTER_PORT", "1"}})
                .rank,
            2);
  // A world of one needs no address.
  const LaunchEnvironment alone = read({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}});
  EXPECT_EQ(alone.world_size, 1);
  EXPECT_TRUE(alone.master_addr.empty());
}

TEST(LaunchEnvironment, MissingOrMalformedVariablesAreOneLineEach) {
  const std::map<std::string, std::string> full = {
      {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}};
  EXPECT_EQ(error_of([&] { read(full); }), "");
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) {
    auto partial = full;
    partial.erase(name);
    const std::string message = error_of([&] { read(partial); });
    SCOPED_TRACE(name);
    EXPECT_EQ(message.rfind("fusekit dp: ", 0), 0u) << message;
    EXPECT_NE(message.find(std::string(name) + " "), std::string::npos) << message;
    EXPECT_NE(message.find("is not set"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  EXPECT_EQ(error_of([&] {
              auto bad = full;
              bad.erase("LOCAL_RANK");
              read(bad);
            }),
            "fusekit dp: LOCAL_RANK or OMPI_COMM_WORLD_LOCAL_RANK is not set for a world of 2 ranks (torchrun sets "
            "RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; with mpirun pass -x MASTER_ADDR=<host of "
            "rank 0> -x MASTER_PORT=<free port>)");
  const std::vector<std::pair<std::string, std::string>> malformed = {
      {"RANK", "one"},          {"RANK", "2"},       {"RANK", "-1"},       {"WORLD_SIZE", "0"}, {"WORLD_SIZE", "2x"},
      {"MASTER_PORT", "70000"}, {"MASTER_PORT", ""}, {"LOCAL_RANK", "-3"}, {"MASTER_ADDR", ""}};
  for (const auto& [name, value] : malformed) {
    auto bad = full;
    bad[name] = value;
    const std::string message = error_of([&] { read(bad); });
    SCOPED_TRACE(name + "=" + value);
    EXPECT_NE(message.find(name), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  EXPECT_EQ(error_of([&] {
              auto bad = full;
              bad["RANK"] = "2";
              read(bad);
            }),
            "fusekit dp: RANK='2' is not an integer from 0 to 1");
  EXPECT_NE(error_of([&] {
              auto bad = full;
              bad["FUSEKIT_RENDEZVOUS_TIMEOUT"] = "0";
              read(bad);
            }).find("FUSEKIT_RENDEZVOUS_TIMEOUT='0'"),
            std::string::npos);
}

TEST(LaunchEnvironment, LocalDevice) {
  EXPECT_EQ(local_device(0, 8), 0);
  EXPECT_EQ(local_device(3, 4), 3);
  EXPECT_EQ(local_device(5, 1), 0);  // the launcher gave the process one GPU of its own
  EXPECT_EQ(error_of([] { local_device(4, 4); }),
            "fusekit dp: local rank 4 has no GPU of its own: 4 are visible (start at most one rank per GPU)");
  EXPECT_EQ(error_of([] { local_device(0, 0); }), "fusekit dp: no GPU is visible to local rank 0");
}

// Every rank a thread; rank 0 starts last (the others retry until it listens).
TEST(Rendezvous, EveryRankGetsRankZerosBlob) {
  for (int world : {2, 4, 8}) {
    SCOPED_TRACE("world " + std::to_string(world));
    std::vector<uint8_t> blob(128);
    std::mt19937 rng(world);
    for (uint8_t& b : blob) b = static_cast<uint8_t>(rng());
    const uint16_t port = free_port();
    std::vector<std::vector<uint8_t>> got(world);
    std::vector<std::string> errors(world);
    std::vector<std::thread> threads;
    for (int r = world - 1; r >= 0; --r) {
      threads.emplace_back([&, r] {
        if (r == 0) std::this_thread::sleep_for(milliseconds(300));
        std::vector<uint8_t> own(128, static_cast<uint8_t>(r));  // what the others pass is not read
        errors[r] = error_of([&] {
          got[r] = broadcast_blob(rank_of(r, world, port, milliseconds(20000)), r == 0 ? blob : own, blob.size());
        });
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(errors[r], "") << "rank " << r;
      EXPECT_EQ(got[r], blob) << "rank " << r;
    }
  }
}

TEST(Rendezvous, OneRankAloneNeedsNoSocket) {
  const std::vector<uint8_t> blob = {1, 2, 3};
  LaunchEnvironment alone;
  EXPECT_EQ(broadcast_blob(alone, blob, blob.size()), blob);
}

// A connection that is not a rank (a port scanner, a health check) is dropped and waited past.
TEST(Rendezvous, StrayConnectionsAreIgnored) {
  const uint16_t port = free_port();
  const std::vector<uint8_t> blob(128, 7);
  std::vector<uint8_t> got;
  std::string root_error, client_error;
  std::thread root([&] {
    root_error = error_of([&] { broadcast_blob(rank_of(0, 2, port, milliseconds(20000)), blob, blob.size()); });
  });
  std::this_thread::sleep_for(milliseconds(200));
  const int stray = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  ASSERT_EQ(::connect(stray, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  const char garbage[] = "GET / HTTP/1.0\r\n\r\n";
  ASSERT_GT(::send(stray, garbage, sizeof garbage, 0), 0);
  std::thread client([&] {
    client_error = error_of([&] { got = broadcast_blob(rank_of(1, 2, port, milliseconds(20000)), {}, blob.size()); });
  });
  client.join();
  root.join();
  ::close(stray);
  EXPECT_EQ(root_error, "");
  EXPECT_EQ(client_error, "");
  EXPECT_EQ(got, blob);
}

TEST(Rendezvous, RankZeroNamesTheRanksThatDidNotConnect) {
  const uint16_t port = free_port();
  const std::vector<uint8_t> blob(128, 1);
  std::string root_error, client_error;
  std::thread root([&] {
    root_error = error_of([&] { broadcast_blob(rank_of(0, 4, port, milliseconds(1500)), blob, blob.size()); });
  });
  std::thread client([&] {
    client_error = error_of([&] { broadcast_blob(rank_of(2, 4, port, milliseconds(10000)), {}, blob.size()); });
  });
  root.join();
  client.join();
  EXPECT_EQ(root_error, "fusekit dp: rendezvous: rank 0 of 4: ranks 1, 3 did not connect to port " +
                            std::to_string(port) + " within 1.5 s");
  // Rank 2 had connected; it learns that rank 0 gave up.
  EXPECT_EQ(client_error, "fusekit dp: rendezvous: rank 2 of 4: rank 0 at localhost:" + std::to_string(port) +
                              " closed the connection before the blob");
}

TEST(Rendezvous, AnUnreachableRankZeroIsATimeout) {
  const uint16_t port = free_port();
  const std::string message = error_of([&] { broadcast_blob(rank_of(1, 2, port, milliseconds(700)), {}, 128); });
  EXPECT_EQ(message.rfind("fusekit dp: rendezvous: rank 1 of 2: could not reach rank 0 at localhost:" +
                              std::to_string(port) + " within 0.7 s (",
                          0),
            0u)
      << message;
  EXPECT_NE(message.find("refused"), std::string::npos) << message;
}

TEST(Rendezvous, ABusyPortIsOneLine) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = 0;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t length = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  const uint16_t port = ntohs(address.sin_port);
  const std::vector<uint8_t> blob(128, 1);
  EXPECT_EQ(error_of([&] { broadcast_blob(rank_of(0, 2, port, milliseconds(500)), blob, blob.size()); }),
            "fusekit dp: rendezvous: rank 0 of 2: cannot listen on port " + std::to_string(port) +
                ": Address already in use (set FUSEKIT_RENDEZVOUS_PORT to a free port)");
  ::close(fd);
}

TEST(Rendezvous, ADifferentWorldSizeIsAnError) {
  const uint16_t port = free_port();
  const std::vector<uint8_t> blob(128, 1);
  std::string root_error, client_error;
  std::thread root([&] {
    root_error = error_of([&] { broadcast_blob(rank_of(0, 2, port, milliseconds(5000)), blob, blob.size()); });
  });
  std::thread client([&] {
    client_error = error_of([&] { broadcast_blob(rank_of(1, 3, port, milliseconds(5000)), {}, blob.size()); });
  });
  root.join();
  client.join();
  EXPECT_EQ(root_error, "fusekit dp: rendezvous: rank 0 of 2: rank 1 was started for a world of 3 ranks");
  EXPECT_NE(client_error.find("closed the connection"), std::string::npos) << client_error;
}

}  // namespace
}  // namespace fusekit::dp

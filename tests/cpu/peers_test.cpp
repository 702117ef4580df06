// The peers' protocol (suites/peers.h): the listing of cases, the results parser and its errors,
// and the recording of results into a store. No GPU needed: building cases allocates nothing.
#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "posix_files.h"
#include "reports/run_report.h"
#include "suites/ops/ops_suite.h"
#include "suites/peers.h"

namespace fusekit::suites {
namespace {

using test_support::parent_of;
using test_support::path_exists;
using test_support::TempDir;

std::vector<ListedCase> two_cases() { return list_ops_cases({"layernorm", "8192x768", "fp16", false, {}, "ops"}); }

// The message of the std::runtime_error that parse_peer_results throws on `text`.
std::string error_of(const std::string& text) {
  try {
    parse_peer_results(text, two_cases(), "results");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(CaseListing, OneCaseWithItsBytes) {
  const std::vector<ListedCase> cases = list_ops_cases({"layernorm", "8192x768", "fp16", false, {}, "ops"});
  ASSERT_EQ(cases.size(), 1u);
  EXPECT_EQ(cases[0].info.name, "layernorm/8192x768/fp16/fwd");
  EXPECT_EQ(cases[0].info.variant, "");
  EXPECT_FALSE(cases[0].backward);
  // Inference forward: read x, gamma, beta, write y: 2 * 8192 * 768 * 2 + 2 * 768 * 2 bytes.
  EXPECT_EQ(cases[0].info.bytes, 25168896.0);
  EXPECT_EQ(case_listing_json(cases),
            "[\n{\"name\": \"layernorm/8192x768/fp16/fwd\", \"op\": \"layernorm\", \"shape\": \"8192x768\", "
            "\"dtype\": \"fp16\", \"direction\": \"fwd\", \"bytes\": 25168896, \"flops\": 0}\n]\n");
}

TEST(CaseListing, FlopsAndTheBackwardDirection) {
  const std::vector<ListedCase> cases = list_ops_cases({"linear", "8192x768x3072:bias", "bf16", true, {}, "ops"});
  ASSERT_EQ(cases.size(), 1u);
  EXPECT_EQ(cases[0].info.name, "linear/8192x768x3072:bias/bf16/fwd+bwd");
  EXPECT_TRUE(cases[0].backward);
  EXPECT_EQ(cases[0].info.flops, 2.0 * 8192 * 768 * 3072 * 3);  // forward GEMM, then dx and dW
  EXPECT_NE(case_listing_json(cases).find("\"direction\": \"fwd+bwd\""), std::string::npos);
}

TEST(CaseListing, SuiteSelectionInSuiteOrder) {
  const std::vector<ListedCase> cases = list_ops_cases({"", "", "fp16", false, {"adamw", "layernorm"}, "ops"});
  // layernorm before adamw (suite order): 8 shapes forward, 8 forward + backward; adamw 3 lists, forward only.
  ASSERT_EQ(cases.size(), 19u);
  EXPECT_EQ(cases.front().info.name, "layernorm/8192x768/fp16/fwd");
  EXPECT_EQ(cases[8].info.name, "layernorm/8192x768/fp16/fwd+bwd");
  EXPECT_EQ(cases[16].info.name, "adamw/bert-base/fp16/fwd");
  EXPECT_FALSE(cases[16].backward);
}

// The listing names the cases ops_cases builds, once each, in the same order and with the same bytes.
TEST(CaseListing, MatchesTheCasesBenchRuns) {
  for (const std::string& suite : op_suites()) {
    const std::vector<Case> built = ops_cases({"", "", "", false, {}, suite});
    const std::vector<ListedCase> listed = list_ops_cases({"", "", "", false, {}, suite});
    std::vector<const store::CaseInfo*> unique;
    std::set<std::string> seen;
    for (const Case& c : built) {
      if (seen.insert(c.info.name).second) unique.push_back(&c.info);
    }
    ASSERT_EQ(listed.size(), unique.size()) << suite;
    for (size_t i = 0; i < listed.size(); ++i) {
      EXPECT_EQ(listed[i].info.name, unique[i]->name);
      EXPECT_EQ(listed[i].info.bytes, unique[i]->bytes) << unique[i]->name;
      EXPECT_EQ(listed[i].info.flops, unique[i]->flops) << unique[i]->name;
      const std::string direction = listed[i].backward ? "/fwd+bwd" : "/fwd";
      EXPECT_EQ(listed[i].info.name.substr(listed[i].info.name.size() - direction.size()), direction);
    }
  }
}

// NAME:DTYPE in --ops: that operator in that dtype only, the others in the suite's dtypes; suite order
// and, per operator, fp16 before bf16 whatever the order of the entries.
TEST(CaseListing, AnOperatorInOneDtype) {
  const std::vector<ListedCase> cases =
      list_ops_cases({"", "", "", false, {"swin_step:fp16", "bert_step:bf16", "bert_step:fp16"}, "models"});
  std::vector<std::string> names;
  for (const ListedCase& c : cases) names.push_back(c.info.name);
  ASSERT_EQ(names.size(), 10u);  // BERT: 4 shapes in 2 dtypes; Swin: 2 shapes in fp16
  EXPECT_EQ(names[0], "bert_step/bert-base:b64:s128/fp16/fwd");
  EXPECT_EQ(names[4], "bert_step/bert-base:b64:s128/bf16/fwd");
  EXPECT_EQ(names[8], "swin_step/swin-t:b128/fp16/fwd");
  EXPECT_EQ(names[9], "swin_step/swin-b:b64/fp16/fwd");
  const std::vector<ListedCase> swin_bf16 = list_ops_cases({"", "", "", false, {"swin_step:bf16"}, "models"});
  ASSERT_EQ(swin_bf16.size(), 2u);
  EXPECT_EQ(swin_bf16[0].info.dtype, "bf16");
  // A plain name keeps the suite's two dtypes, or --dtype's one.
  EXPECT_EQ(list_ops_cases({"", "", "", false, {"swin_step"}, "models"}).size(), 4u);
  EXPECT_EQ(list_ops_cases({"", "", "bf16", false, {"swin_step"}, "models"}).size(), 2u);
  EXPECT_EQ(list_ops_cases({"", "", "bf16", false, {"swin_step:bf16"}, "models"}).size(), 2u);
}

// NAME@SHAPE in --ops: that operator at that shape only (with :DTYPE, in that dtype only too); the
// other entries as before, and the suite's order whatever the entries' order.
TEST(CaseListing, AnOperatorAtOneShape) {
  auto names_of = [](const std::vector<ListedCase>& cases) {
    std::vector<std::string> names;
    for (const ListedCase& c : cases) names.push_back(c.info.name);
    return names;
  };
  EXPECT_EQ(names_of(list_ops_cases(
                {"", "", "", false, {"swin_step@swin-t:b128", "bert_step@bert-base:b64:s128"}, "models"})),
            (std::vector<std::string>{"bert_step/bert-base:b64:s128/fp16/fwd", "bert_step/bert-base:b64:s128/bf16/fwd",
                                      "swin_step/swin-t:b128/fp16/fwd", "swin_step/swin-t:b128/bf16/fwd"}));
  EXPECT_EQ(names_of(list_ops_cases({"", "", "", false, {"bert_step:bf16@bert-large:b8:s512"}, "models"})),
            (std::vector<std::string>{"bert_step/bert-large:b8:s512/bf16/fwd"}));
  EXPECT_EQ(names_of(list_ops_cases({"", "", "fp16", false, {"swin_step@swin-b:b64"}, "models"})),
            (std::vector<std::string>{"swin_step/swin-b:b64/fp16/fwd"}));
  // One entry at a shape and another for the whole operator: the whole operator.
  EXPECT_EQ(list_ops_cases({"", "", "fp16", false, {"swin_step@swin-b:b64", "swin_step"}, "models"}).size(), 2u);
  // An operator suite's shapes are selected the same way, forward and forward + backward.
  const std::vector<ListedCase> layernorm = list_ops_cases({"", "", "fp16", false, {"layernorm@8192x768"}, "ops"});
  ASSERT_EQ(layernorm.size(), 2u);
  EXPECT_EQ(layernorm[0].info.name, "layernorm/8192x768/fp16/fwd");
  EXPECT_EQ(layernorm[1].info.name, "layernorm/8192x768/fp16/fwd+bwd");
}

TEST(CaseListing, BadSelectionsAreUsageErrors) {
  EXPECT_THROW(list_ops_cases({"", "", "", false, {"bert_step@bert-base:b64:s999"}, "models"}), std::invalid_argument);
  EXPECT_THROW(list_ops_cases({"", "", "", false, {"bert_step@"}, "models"}), std::invalid_argument);
  EXPECT_THROW(list_ops_cases({"", "", "", false, {"bert_step:fp8@bert-base:b64:s128"}, "models"}),
               std::invalid_argument);
  EXPECT_THROW(list_ops_cases({"nosuchop", "1x1", "fp16", false, {}, "ops"}), std::invalid_argument);
  EXPECT_THROW(list_ops_cases({"layernorm", "8192", "fp16", false, {}, "ops"}), std::invalid_argument);
  EXPECT_THROW(list_ops_cases({"adamw", "bert-base", "fp16", true, {}, "ops"}), std::invalid_argument);
  EXPECT_THROW(list_ops_cases({"", "", "", false, {}, "demo"}), std::invalid_argument);
  EXPECT_THROW(list_ops_cases({"", "", "fp8", false, {}, "ops"}), std::invalid_argument);
  EXPECT_THROW(list_ops_cases({"", "", "", false, {"swin_step:fp8"}, "models"}), std::invalid_argument);
  EXPECT_THROW(list_ops_cases({"", "", "fp16", false, {"swin_step:bf16"}, "models"}), std::invalid_argument);
  EXPECT_THROW(list_ops_cases({"", "", "", false, {"swinstep:fp16"}, "models"}), std::invalid_argument);
}

TEST(PeerResults, GoodLines) {
  const std::string text =
      "{\"name\": \"layernorm/8192x768/fp16/fwd\", \"variant\": \"peer:eager\", \"samples_ns\": [31000.5, 3.1e4]}\n"
      "\n"
      "  { \"samples_ns\" : [ 1 ] , \"variant\":\"peer:compile\",\"name\":\"layernorm\\/8192x768\\/fp16\\/fwd\" }\r\n";
  const std::vector<PeerResult> results = parse_peer_results(text, two_cases(), "results");
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].name, "layernorm/8192x768/fp16/fwd");
  EXPECT_EQ(results[0].variant, "peer:eager");
  EXPECT_EQ(results[0].samples_ns, (std::vector<double>{31000.5, 31000.0}));
  EXPECT_EQ(results[1].name, "layernorm/8192x768/fp16/fwd");
  EXPECT_EQ(results[1].variant, "peer:compile");
  EXPECT_EQ(results[1].samples_ns, (std::vector<double>{1.0}));
  EXPECT_TRUE(parse_peer_results("", two_cases(), "results").empty());
}

TEST(PeerResults, EachBadLineNamesItsLineAndFault) {
  const std::string good =
      "{\"name\": \"layernorm/8192x768/fp16/fwd\", \"variant\": \"peer:eager\", "
      "\"samples_ns\": [1]}\n";
  const std::string name = "\"name\": \"layernorm/8192x768/fp16/fwd\"";
  EXPECT_EQ(error_of(good + "\n{\"name\": \"layernorm/8192x768/fp16/fwd+bwd\", \"variant\": \"peer:eager\", "
                            "\"samples_ns\": [1]}"),
            "results line 3: case \"layernorm/8192x768/fp16/fwd+bwd\" is not one of the listed cases");
  EXPECT_EQ(error_of("{" + name + ", \"variant\": \"eager\", \"samples_ns\": [1]}"),
            "results line 1: variant \"eager\" does not name a peer (peer:<name>)");
  EXPECT_EQ(error_of("{" + name + ", \"variant\": \"peer:\", \"samples_ns\": [1]}"),
            "results line 1: variant \"peer:\" does not name a peer (peer:<name>)");
  EXPECT_EQ(error_of("{" + name + ", \"variant\": \"peer:eager\", \"samples_ns\": []}"), "results line 1: no samples");
  EXPECT_EQ(error_of("{" + name + ", \"variant\": \"peer:eager\", \"samples_ns\": [5, NaN]}"),
            "results line 1: samples_ns[1] = nan is not a finite positive number");
  EXPECT_EQ(error_of("{" + name + ", \"variant\": \"peer:eager\", \"samples_ns\": [Infinity]}"),
            "results line 1: samples_ns[0] = inf is not a finite positive number");
  EXPECT_EQ(error_of("{" + name + ", \"variant\": \"peer:eager\", \"samples_ns\": [0]}"),
            "results line 1: samples_ns[0] = 0.000000 is not a finite positive number");
  EXPECT_EQ(error_of("{" + name + ", \"variant\": \"peer:eager\", \"samples_ns\": [-2]}"),
            "results line 1: samples_ns[0] = -2.000000 is not a finite positive number");
  EXPECT_EQ(error_of("{" + name + ", \"variant\": \"peer:eager\", \"samples_ns\": [1, \"2\"]}"),
            "results line 1: samples_ns[1] is not a number");
  EXPECT_EQ(error_of(good + good),
            "results line 2: \"layernorm/8192x768/fp16/fwd\" [peer:eager] was given on line 1 "
            "already");
  EXPECT_EQ(error_of("{" + name + ", \"samples_ns\": [1]}"), "results line 1: no \"variant\"");
  EXPECT_EQ(error_of("{\"variant\": \"peer:eager\", \"samples_ns\": [1]}"), "results line 1: no \"name\"");
  EXPECT_EQ(error_of("{" + name + ", \"variant\": \"peer:eager\"}"), "results line 1: no \"samples_ns\"");
  EXPECT_EQ(error_of("{" + name + ", \"variant\": \"peer:eager\", \"samples_ns\": [1], \"bytes\": 5}"),
            "results line 1: unknown field \"bytes\" (expected name, variant, samples_ns, metrics)");
  const std::string with = "{" + name + ", \"variant\": \"peer:eager\", \"samples_ns\": [1], \"metrics\": ";
  EXPECT_EQ(error_of(with + "{\"peak_memory_bytes\": NaN}}"),
            "results line 1: metrics.peak_memory_bytes is not finite");
  EXPECT_EQ(error_of(with + "{\"a\": 1, \"a\": 2}}"), "results line 1: metrics.a given twice");
  EXPECT_EQ(error_of(with + "{\"\": 1}}"), "results line 1: a metric without a name");
  EXPECT_EQ(error_of(with + "{\"a\": \"1\"}}"), "results line 1: metrics.a is not a number");
  EXPECT_EQ(error_of(with + "[1]}"), "results line 1: expected \"metrics\" as an object of numbers at column 96");
  EXPECT_EQ(error_of("{" + name + ", " + name + "}"), "results line 1: \"name\" given twice");
  EXPECT_EQ(error_of("{\"name\": 5}"), "results line 1: expected \"name\" as a string at column 10");
  EXPECT_EQ(error_of("{" + name + ", \"variant\": \"peer:eager\", \"samples_ns\": 1}"),
            "results line 1: expected \"samples_ns\" as an array of numbers at column 80");
  EXPECT_EQ(error_of("[1, 2]"), "results line 1: expected a JSON object at column 1");
  EXPECT_EQ(error_of("{" + name), "results line 1: expected ',' or '}' at column 39");
  EXPECT_EQ(error_of("{" + name + ", \"variant\": \"peer:eager\", \"samples_ns\": [1]} x"),
            "results line 1: text after the object");
  EXPECT_EQ(error_of("{\"name\": \"layernorm"), "results line 1: unterminated string");
}

class PeerRecording : public ::testing::Test {
 protected:
  void SetUp() override {
    temp_ = std::make_unique<TempDir>("fusekit_peers_test_");
    dir_ = temp_->path();
  }
  void TearDown() override { temp_.reset(); }
  std::unique_ptr<TempDir> temp_;
  std::string dir_;
};

TEST_F(PeerRecording, ResultsBecomeCasesWithTheListedDescription) {
  const std::vector<ListedCase> cases = list_ops_cases({"linear", "8192x768x3072:bias", "bf16", true, {}, "ops"});
  store::Store store = store::Store::open(dir_ + "/peers.db", store::Store::Mode::create);
  const int64_t run = store.begin_run({});
  const std::string text =
      "{\"name\": \"linear/8192x768x3072:bias/bf16/fwd+bwd\", \"variant\": \"peer:compile\", "
      "\"samples_ns\": [300, 100, 200]}\n";
  record_peer_results(store, run, parse_peer_results(text, cases, "results"), cases);
  const std::vector<store::StoredCase> stored = store.load_cases(run);
  ASSERT_EQ(stored.size(), 1u);
  EXPECT_EQ(stored[0].info.name, cases[0].info.name);
  EXPECT_EQ(stored[0].info.op, "linear");
  EXPECT_EQ(stored[0].info.shape, "8192x768x3072:bias");
  EXPECT_EQ(stored[0].info.dtype, "bf16");
  EXPECT_EQ(stored[0].info.variant, "peer:compile");
  EXPECT_EQ(stored[0].info.bytes, cases[0].info.bytes);
  EXPECT_EQ(stored[0].info.flops, cases[0].info.flops);
  EXPECT_EQ(stored[0].samples_ns, (std::vector<double>{300, 100, 200}));
  EXPECT_EQ(reports::load_case_results(store, run).at(0).median_ns, 200);
}

TEST_F(PeerRecording, MetricsAreParsedAndStoredWithTheCase) {
  const std::vector<ListedCase> cases = list_ops_cases({"linear", "8192x768x3072:bias", "bf16", true, {}, "ops"});
  store::Store store = store::Store::open(dir_ + "/metrics.db", store::Store::Mode::create);
  const int64_t run = store.begin_run({});
  const std::string text =
      "{\"name\": \"linear/8192x768x3072:bias/bf16/fwd+bwd\", \"variant\": \"peer:eager\", "
      "\"samples_ns\": [300], \"metrics\": {\"peak_memory_bytes\": 1.5e9, \"other\": 2}}\n"
      "{\"name\": \"linear/8192x768x3072:bias/bf16/fwd+bwd\", \"variant\": \"peer:compile\", "
      "\"samples_ns\": [200], \"metrics\": {}}\n";
  record_peer_results(store, run, parse_peer_results(text, cases, "results"), cases);
  const std::vector<store::StoredCase> stored = store.load_cases(run);
  ASSERT_EQ(stored.size(), 2u);
  ASSERT_EQ(stored[0].metrics.size(), 2u);
  EXPECT_EQ(stored[0].metrics[0].name, "peak_memory_bytes");
  EXPECT_EQ(stored[0].metrics[0].value, 1.5e9);
  EXPECT_EQ(stored[0].metrics[1].name, "other");
  EXPECT_TRUE(stored[1].metrics.empty());
  EXPECT_EQ(reports::case_metric(reports::load_case_results(store, run).at(0), "peak_memory_bytes"), 1.5e9);
}

TEST_F(PeerRecording, PeerFilesHoldTheListingAndGoAway) {
  ::setenv("TMPDIR", dir_.c_str(), 1);
  std::string folder;
  {
    const PeerFiles files(two_cases());
    folder = parent_of(files.cases_path());
    EXPECT_EQ(parent_of(folder), dir_);
    std::ifstream in(files.cases_path());
    const std::string listing((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(listing, case_listing_json(two_cases()));
    store::Store store = store::Store::open(dir_ + "/files.db", store::Store::Mode::create);
    const int64_t run = store.begin_run({});
    EXPECT_THROW(files.record_results(store, run), std::runtime_error);  // no results file written
    EXPECT_EQ(files.record_results(store, run, true), 0u);               // a warning once the script failed
    std::ofstream(files.results_path()) << "{\"name\": \"layernorm/8192x768/fp16/fwd\", \"vari";  // cut short
    EXPECT_THROW(files.record_results(store, run), std::runtime_error);
    EXPECT_EQ(files.record_results(store, run, true), 0u);
    EXPECT_TRUE(store.load_cases(run).empty());
    std::ofstream(files.results_path())
        << "{\"name\": \"layernorm/8192x768/fp16/fwd\", \"variant\": \"peer:eager\", \"samples_ns\": [1, 2]}\n";
    EXPECT_EQ(files.record_results(store, run), 1u);
    EXPECT_EQ(store.load_cases(run).size(), 1u);
  }
  EXPECT_FALSE(path_exists(folder));
  ::unsetenv("TMPDIR");
}

}  // namespace
}  // namespace fusekit::suites

#include "suites/peers.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "suites/ops/ops_suite.h"
#include "suites/recorded_command.h"

namespace fusekit::suites {

void run_peers(store::Store& /*store*/, int64_t run, const std::string& db, const PeersOptions& o) {
  // PyTorch eager and torch.compile on the same cases: timed untraced, then traced for the
  // kernel shares, both into this run.
  std::fprintf(stderr, "fusekit: timing the peers: python3 %s\n", o.script.c_str());
  std::vector<std::string> peer_args = {"python3",     o.script,
                                        "--reps",      std::to_string(o.repetitions),
                                        "--warmup",    std::to_string(o.warmup),
                                        "--warmup-ms", std::to_string(o.warmup_ms),
                                        "--sample-us", std::to_string(o.sample_us)};
  if (!o.op.empty()) {  // the one case bench ran
    peer_args.insert(peer_args.end(), {"--ops", o.op, "--shapes", o.shape, "--dtypes", o.dtype, "--directions",
                                       o.backward ? "fwd+bwd" : "fwd"});
  } else {
    if (!o.dtype.empty()) peer_args.insert(peer_args.end(), {"--dtypes", o.dtype});  // one dtype
    // The operators bench ran: those named, else every one of the suite.
    std::string names;
    for (const OpDefinition& op : ops()) {
      const bool named = std::find(o.ops.begin(), o.ops.end(), op.name) != o.ops.end();
      if (op.suite == o.suite && (o.ops.empty() || named)) names += (names.empty() ? "" : ",") + op.name;
    }
    peer_args.insert(peer_args.end(), {"--ops", names});
  }
  int code = run_recorded_command(db, run, peer_args, 1000, false);
  if (code == 0) {
    std::fprintf(stderr, "fusekit: tracing the peers: python3 %s --traced-only\n", o.script.c_str());
    peer_args.push_back("--traced-only");
    code = run_recorded_command(db, run, peer_args, 1000, true);
  }
  if (code != 0) throw std::runtime_error("the peers script failed with exit code " + std::to_string(code));
}

}  // namespace fusekit::suites

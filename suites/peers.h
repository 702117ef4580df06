// The peers: PyTorch eager and torch.compile timed on the same cases as fusekit's variants, by a
// Python script (scripts/peers/ops.py) run twice into the same run of the store: untraced for the
// timed samples, then traced (--traced-only) for the kernel shares.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "store/store.h"

namespace fusekit::suites {

struct PeersOptions {
  std::string script;  // the peers script; empty: no peers
  int repetitions = 50;
  int warmup = 10;
  double warmup_ms = 25;
  double sample_us = 500;
  // The cases the session ran: one operator case (op, shape, dtype, backward), or the operators
  // `ops` of `suite` (all of them if empty), in `dtype` only if given.
  std::string op;
  std::string shape;
  std::string dtype;
  bool backward = false;
  std::vector<std::string> ops;
  std::string suite;
};

// Runs the peers script into `run` of `store` (the store at `db`); throws if it fails.
void run_peers(store::Store& store, int64_t run, const std::string& db, const PeersOptions& options);

}  // namespace fusekit::suites

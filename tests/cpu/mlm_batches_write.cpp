// Writes synthetic MLM batches (models/mlm_data.h) to a safetensors file, for the check that the
// Python port of the generator (scripts/peers/mlm_data.py) gives the same batches.
// Usage: mlm_batches_write FILE
#include <cstdio>
#include <exception>
#include <string>

#include "models/mlm_data.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: mlm_batches_write FILE\n");
    return 2;
  }
  try {
    fusekit::models::MlmDataOptions options;
    options.batch = 6;
    options.sequence = 48;
    options.min_length = 3;  // short single-segment sequences too
    options.seed = 0xFEEDFACEull;
    fusekit::models::write_mlm_batches(argv[1], options, 3, 4);
    options.sequence = 512;
    options.batch = 2;
    options.min_length = 0;
    options.seed = 1;
    fusekit::models::write_mlm_batches(std::string(argv[1]) + ".512", options, 0, 2);
    options.sequence = 64;
    options.batch = 8;
    options.echo = true;
    fusekit::models::write_mlm_batches(std::string(argv[1]) + ".echo", options, 5, 3);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mlm_batches_write: %s\n", e.what());
    return 1;
  }
  return 0;
}

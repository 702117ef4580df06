// fusekit-dp: data-parallel BERT masked-LM training on fusekit's fused step (models/bert_fused.h),
// one process per GPU, with the gradients exchanged densely (ncclAllReduce), sparsely (top-k with
// error feedback and the balanced sparse collective) or by the exchange that measured faster
// (dp/gradient_exchanger.h). Started by torchrun or mpirun (dp/rendezvous.h says which variables
// it reads):
//   torchrun --no-python --standalone --nproc-per-node=4 build/fusekit-dp --exchange sparse
//       --density 0.01 --steps 300 --json out/dp.json
// Every rank starts from the same weights (models/bert_init.h) and trains on its own batches
// (models/mlm_data.h; rank r's pool is batches r * pool .. r * pool + pool - 1, cycled), with its
// own dropout masks. Rank 0 prints a line every --print-every steps and the summary, and writes
// the JSON record (every step's loss averaged over the ranks, phase times, bytes; the summary's
// medians skip the first --skip steps). Exit codes: 0 done, 1 a failure, 2 a usage error.
#include <cuda_runtime.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "dp/communicator.h"
#include "dp/gradient_exchanger.h"
#include "dp/nccl_check.h"
#include "dp/rendezvous.h"
#include "kernels/cuda_check.h"
#include "models/bert_config.h"
#include "models/bert_fused.h"
#include "models/bert_init.h"
#include "models/mlm_data.h"

namespace {

using namespace fusekit;

struct Options {
  std::string model = "bert-base";
  int batch = 64;
  int sequence = 128;
  std::string dtype = "fp16";
  std::string exchange = "dense";
  std::string collective = "balanced";
  double density = 0.01;
  int64_t warmup_steps = 0;
  double warmup_start = 0.25;
  double momentum = 0;
  double reselect = 1;
  std::string index_form = "plain";
  int64_t dense_steps = 0;
  bool frozen_variance = false;
  double frozen_max_step = 0;
  bool rank_by_step = false;
  int model_hosts = 1;
  int probe_steps = 5;
  int steps = 300;
  int pool = 32;
  int skip = 10;
  double lr = 1e-4;
  int lr_warmup = 0;
  bool echo = false;
  uint64_t seed = 1;
  int print_every = 25;
  std::string json;
  std::string label;
};

// Per step, this rank's numbers (the summary takes rank 0's times and every rank's bytes).
struct StepRow {
  double loss = 0;        // this rank's batch; the mean over ranks replaces it at the end
  double step_ms = 0;     // events around the enqueued step: forward, backward, exchange, optimizer
  double compute_ms = 0;  // step_ms less the exchange (forward + backward + optimizer)
  double selection_ms = 0, communication_ms = 0, narrow_ms = 0, probe_ms = 0;
  double bytes_sent = 0;
  double imbalance = 1;
  double density = 0;
  uint64_t entries = 0;
  bool sparse = false;
};

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Sums `values` over the ranks, in place (float64, through NCCL).
void allreduce_sum(dp::Communicator& comm, std::vector<double>& values) {
  double* device = nullptr;
  const size_t bytes = values.size() * sizeof(double);
  FUSEKIT_CUDA_CHECK(cudaMalloc(&device, bytes));
  FUSEKIT_CUDA_CHECK(cudaMemcpy(device, values.data(), bytes, cudaMemcpyHostToDevice));
  FUSEKIT_NCCL_CHECK(ncclAllReduce(device, device, values.size(), ncclFloat64, ncclSum, comm.comm(), comm.stream()));
  FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(comm.stream()));
  FUSEKIT_CUDA_CHECK(cudaMemcpy(values.data(), device, bytes, cudaMemcpyDeviceToHost));
  FUSEKIT_CUDA_CHECK(cudaFree(device));
}

// Every rank's `values` side by side on every rank (rank r's at r * values.size()).
std::vector<double> allgather(dp::Communicator& comm, const std::vector<double>& values) {
  std::vector<double> all(values.size() * comm.size(), 0.0);
  std::copy(values.begin(), values.end(), all.begin() + static_cast<long>(values.size() * comm.rank()));
  allreduce_sum(comm, all);
  return all;
}

const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

// Models `hosts` hosts on one machine: consecutive groups of ranks get their own NCCL_HOSTID (what
// NCCL hashes as the host's identity), so NCCL connects ranks of a group over NVLink or shared
// memory and ranks of different groups over its network transport (NCCL_NET=Socket: sockets), as
// between hosts. Set before the communicator exists; NCCL reads it at initialization.
void model_hosts(const dp::LaunchEnvironment& launch, int hosts) {
  if (hosts <= 1) return;
  if (launch.world_size % hosts != 0) {
    throw std::invalid_argument("--model-hosts " + std::to_string(hosts) + " does not divide " +
                                std::to_string(launch.world_size) + " ranks");
  }
  const int host = launch.rank / (launch.world_size / hosts);
  // The real host's name first: across machines, groups of different machines stay apart.
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  setenv("NCCL_HOSTID", (std::string(name) + "-fusekit-model-host-" + std::to_string(host)).c_str(), 1);
}

int run(const Options& o) {
  const dp::LaunchEnvironment launch = dp::read_launch_environment();
  model_hosts(launch, o.model_hosts);
  dp::Communicator comm(launch);
  const int P = comm.size(), rank = comm.rank();
  const models::BertConfig config = models::parse_bert_config(o.model + ":b" + std::to_string(o.batch) + ":s" +
                                                              std::to_string(o.sequence) + ":" + o.dtype);
  dp::ExchangerOptions x;
  x.mode = dp::parse_exchange_mode(o.exchange);
  x.collective = dp::parse_collective_kind(o.collective);
  x.density = o.density;
  x.warmup_steps = o.warmup_steps;
  x.warmup_start = o.warmup_start;
  x.momentum = o.momentum;
  x.reselect = o.reselect;
  x.index_form = dp::parse_index_form(o.index_form);
  x.probe_steps = o.probe_steps;
  x.dense_steps = o.dense_steps;
  x.frozen_variance = o.frozen_variance;
  x.frozen_max_step = o.frozen_max_step;
  x.rank_by_step = o.rank_by_step;

  models::BertTrainOptions train;
  if (o.frozen_variance) x.momentum = train.beta1;  // each rank's velocity is AdamW's first moment / (1 - beta1)
  train.lr = o.lr;
  train.seed = o.seed * 1000003u + static_cast<uint64_t>(rank);  // each rank its own dropout masks
  models::FusedBert model(config, train);
  {
    const models::BertInitialWeights weights(config, o.seed, config.dtype);
    model.load_state_dict(weights.tensors());
  }
  models::MlmDataOptions data;
  data.batch = config.batch;
  data.sequence = config.sequence;
  data.vocab = config.vocab;
  data.seed = o.seed;
  data.echo = o.echo;
  std::vector<models::MlmBatch> batches;
  for (int i = 0; i < o.pool; ++i) {
    batches.push_back(models::make_mlm_batch(data, static_cast<uint64_t>(rank) * o.pool + static_cast<uint64_t>(i)));
  }
  model.prepare_batches(batches);
  dp::GradientExchanger exchanger(comm, model.flat_gradients(), x);
  model.set_gradient_exchange(&exchanger);

  const models::FlatGradients flat = model.flat_gradients();
  const double dense_bytes = static_cast<double>(flat.elements) * kernels::dtype_size(flat.dtype);
  if (rank == 0) {
    std::printf(
        "fusekit-dp: %d ranks (%s), %s, %.1fM gradients (%.0f MB), exchange %s, NCCL_P2P_DISABLE=%s "
        "NCCL_SHM_DISABLE=%s, %d model host(s), NCCL_NET=%s\n",
        P, comm.launch().launcher.c_str(), config.spec().c_str(), flat.elements / 1e6, dense_bytes / 1e6,
        exchanger.decision().c_str(), env_or("NCCL_P2P_DISABLE", "unset"), env_or("NCCL_SHM_DISABLE", "unset"),
        o.model_hosts, env_or("NCCL_NET", "unset"));
    std::fflush(stdout);
  }

  cudaStream_t stream = nullptr;
  FUSEKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t begin = nullptr, end = nullptr;
  FUSEKIT_CUDA_CHECK(cudaEventCreate(&begin));
  FUSEKIT_CUDA_CHECK(cudaEventCreate(&end));
  std::vector<StepRow> rows;
  uint64_t nonfinite_steps = 0;
  const auto wall_start = std::chrono::steady_clock::now();
  for (int step = 0; step < o.steps; ++step) {
    if (o.lr_warmup > 0) model.set_learning_rate(o.lr * std::min(1.0, (step + 1.0) / o.lr_warmup));
    FUSEKIT_CUDA_CHECK(cudaEventRecord(begin, stream));
    model.enqueue_step(step % o.pool, stream);
    FUSEKIT_CUDA_CHECK(cudaEventRecord(end, stream));
    StepRow row;
    row.loss = model.last_loss();
    float ms = 0.f;
    FUSEKIT_CUDA_CHECK(cudaEventSynchronize(end));
    FUSEKIT_CUDA_CHECK(cudaEventElapsedTime(&ms, begin, end));
    const dp::ExchangeRecord r = exchanger.last();
    row.step_ms = ms;
    row.selection_ms = r.selection_ms;
    row.communication_ms = r.communication_ms;
    row.narrow_ms = r.narrow_ms;
    row.probe_ms = r.probe_ms;
    row.compute_ms = ms - r.selection_ms - r.communication_ms - r.narrow_ms - r.probe_ms;
    row.bytes_sent = r.stats.bytes_sent;
    row.imbalance = r.stats.imbalance;
    row.density = r.density;
    row.entries = r.entries;
    row.sparse = r.sparse;
    if (r.nonfinite) ++nonfinite_steps;
    rows.push_back(row);
    if (rank == 0 && o.print_every > 0 && (step % o.print_every == 0 || step + 1 == o.steps)) {
      std::printf("step %4d  loss %.4f  step %.2f ms  compute %.2f  selection %.2f  comm %.2f  %s %.3g  %.2f MB sent\n",
                  step, row.loss, row.step_ms, row.compute_ms, row.selection_ms, row.communication_ms,
                  row.sparse ? "density" : "dense", row.density, row.bytes_sent / 1e6);
      std::fflush(stdout);
    }
  }
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();

  // The loss of every step averaged over the ranks; every rank's bytes and loads.
  std::vector<double> losses(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) losses[i] = rows[i].loss;
  allreduce_sum(comm, losses);
  for (double& l : losses) l /= P;
  std::vector<double> step_ms, compute, selection, communication, narrow, bytes, imbalance;
  // The medians leave out the first `skip` steps, and the dense steps that precede a sparse exchange.
  const int first_median = static_cast<int>(std::min<int64_t>(std::max<int64_t>(o.skip, o.dense_steps), o.steps - 1));
  for (size_t i = static_cast<size_t>(first_median); i < rows.size(); ++i) {
    step_ms.push_back(rows[i].step_ms);
    compute.push_back(rows[i].compute_ms);
    selection.push_back(rows[i].selection_ms);
    communication.push_back(rows[i].communication_ms);
    narrow.push_back(rows[i].narrow_ms);
    bytes.push_back(rows[i].bytes_sent);
    imbalance.push_back(rows[i].imbalance);
  }
  // Every rank applied the same summed gradients: its parameters must be bitwise the same as rank 0's.
  double checksum = 0;
  {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the float bits of every parameter
    for (const models::HostTensor& t : model.parameters()) {
      for (float v : t.values) {
        uint32_t bits = 0;
        std::memcpy(&bits, &v, sizeof bits);
        h = (h ^ bits) * 1099511628211ull;
      }
    }
    checksum = static_cast<double>(h >> 12);  // 52 bits: exact in a double
  }
  const std::vector<double> mine = {median_of(bytes), median_of(step_ms), median_of(communication),
                                    static_cast<double>(nonfinite_steps), checksum};
  const std::vector<double> all = allgather(comm, mine);
  double bytes_max = 0, bytes_sum = 0, step_max = 0, nonfinite_all = 0;
  bool same_parameters = true;
  for (int r = 0; r < P; ++r) {
    same_parameters = same_parameters && all[r * mine.size() + 4] == all[4];
    bytes_max = std::max(bytes_max, all[r * mine.size()]);
    bytes_sum += all[r * mine.size()];
    step_max = std::max(step_max, all[r * mine.size() + 1]);
    nonfinite_all += all[r * mine.size() + 3];
  }
  const double bytes_mean = bytes_sum / P;
  if (rank == 0) {
    const int window = std::min<int>(10, static_cast<int>(losses.size()));
    double final_loss = 0;
    for (int i = 0; i < window; ++i) final_loss += losses[losses.size() - 1 - i];
    final_loss /= std::max(window, 1);
    std::printf(
        "fusekit-dp summary: %d ranks, %s, %s; medians over steps %d..%d: step %.3f ms (slowest rank %.3f), "
        "compute %.3f, selection %.3f, communication %.3f, narrowing %.3f; sent per rank %.3f MB (most %.3f, "
        "max/mean %.3f); collective load max/mean %.3f; loss of the last %d steps %.4f; %.1f s\n",
        P, config.spec().c_str(), exchanger.decision().c_str(), first_median, o.steps - 1, median_of(step_ms), step_max,
        median_of(compute), median_of(selection), median_of(communication), median_of(narrow), bytes_mean / 1e6,
        bytes_max / 1e6, bytes_mean > 0 ? bytes_max / bytes_mean : 1.0, median_of(imbalance), window, final_loss,
        wall_s);
    std::printf("fusekit-dp: parameters after the last step %s on every rank\n",
                same_parameters ? "are bitwise the same" : "DIFFER");
    if (nonfinite_all > 0) std::printf("fusekit-dp: %.0f rank-steps had non-finite summed gradients\n", nonfinite_all);
    if (!o.json.empty()) {
      std::ofstream f(o.json);
      if (!f) throw std::runtime_error("cannot write " + o.json);
      char buf[512];
      f << "{\n  \"label\": \"" << o.label << "\",\n  \"ranks\": " << P << ",\n  \"config\": \"" << config.spec()
        << "\",\n  \"exchange\": \"" << o.exchange << "\",\n  \"collective\": \"" << o.collective
        << "\",\n  \"density\": " << o.density << ",\n  \"warmup_steps\": " << o.warmup_steps
        << ",\n  \"momentum\": " << x.momentum << ",\n  \"reselect\": " << o.reselect << ",\n  \"index_form\": \""
        << o.index_form << "\",\n  \"dense_steps\": " << o.dense_steps
        << ",\n  \"frozen_variance\": " << (o.frozen_variance ? "true" : "false")
        << ",\n  \"frozen_max_step\": " << (o.frozen_max_step > 1e300 ? -1 : o.frozen_max_step)
        << ",\n  \"rank_by_step\": " << (o.rank_by_step ? "true" : "false")
        << ",\n  \"frozen_max_step_last\": "  // the cap the last step took (-1: none; 0: no velocity steps)
        << (!o.frozen_variance                    ? 0.0
            : exchanger.frozen_max_step() > 1e300 ? -1.0
                                                  : exchanger.frozen_max_step())
        << ",\n  \"model_hosts\": " << o.model_hosts << ",\n  \"nccl_net\": \"" << env_or("NCCL_NET", "") << "\""
        << ",\n  \"lr\": " << o.lr << ",\n  \"lr_warmup\": " << o.lr_warmup
        << ",\n  \"echo\": " << (o.echo ? "true" : "false") << ",\n  \"pool\": " << o.pool << ",\n  \"decision\": \""
        << exchanger.decision() << "\",\n  \"nccl_p2p_disable\": \"" << env_or("NCCL_P2P_DISABLE", "")
        << "\",\n  \"nccl_shm_disable\": \"" << env_or("NCCL_SHM_DISABLE", "")
        << "\",\n  \"gradient_elements\": " << flat.elements << ",\n  \"skip\": " << first_median;
      std::snprintf(buf, sizeof buf,
                    ",\n  \"summary\": {\"step_ms\": %.4f, \"slowest_rank_step_ms\": %.4f, \"compute_ms\": %.4f, "
                    "\"selection_ms\": %.4f, \"communication_ms\": %.4f, \"narrow_ms\": %.4f, \"bytes_per_rank_mean\": "
                    "%.1f, \"bytes_per_rank_max\": %.1f, \"collective_load_max_over_mean\": %.4f, "
                    "\"final_loss\": %.5f, \"nonfinite_rank_steps\": %.0f, \"same_parameters\": %s, \"wall_s\": %.2f}",
                    median_of(step_ms), step_max, median_of(compute), median_of(selection), median_of(communication),
                    median_of(narrow), bytes_mean, bytes_max, median_of(imbalance), final_loss, nonfinite_all,
                    same_parameters ? "true" : "false", wall_s);
      f << buf << ",\n  \"steps\": [\n";
      for (size_t i = 0; i < rows.size(); ++i) {
        const StepRow& r = rows[i];
        std::snprintf(buf, sizeof buf,
                      "    {\"loss\": %.5f, \"step_ms\": %.4f, \"compute_ms\": %.4f, \"selection_ms\": %.4f, "
                      "\"communication_ms\": %.4f, \"narrow_ms\": %.4f, \"probe_ms\": %.4f, \"bytes_sent\": %.0f, "
                      "\"sparse\": %s, \"density\": %.6g, \"entries\": %llu}%s\n",
                      losses[i], r.step_ms, r.compute_ms, r.selection_ms, r.communication_ms, r.narrow_ms, r.probe_ms,
                      r.bytes_sent, r.sparse ? "true" : "false", r.density, static_cast<unsigned long long>(r.entries),
                      i + 1 < rows.size() ? "," : "");
        f << buf;
      }
      f << "  ]\n}\n";
    }
  }
  FUSEKIT_CUDA_CHECK(cudaEventDestroy(begin));
  FUSEKIT_CUDA_CHECK(cudaEventDestroy(end));
  FUSEKIT_CUDA_CHECK(cudaStreamDestroy(stream));
  model.set_gradient_exchange(nullptr);
  bool same_everywhere = true;
  for (int r = 0; r < P; ++r) same_everywhere = same_everywhere && all[r * mine.size() + 4] == all[4];
  return nonfinite_all > 0 || !same_everywhere ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"fusekit-dp: data-parallel BERT masked-LM training with dense or sparse gradient exchange"};
  app.add_option("--model", o.model, "bert-base | bert-large | bert-tiny")->capture_default_str();
  app.add_option("--batch", o.batch, "Sequences per rank and step")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--seq", o.sequence, "Sequence length")->check(CLI::Range(3, 512))->capture_default_str();
  app.add_option("--dtype", o.dtype, "fp16 | bf16")->check(CLI::IsMember({"fp16", "bf16"}))->capture_default_str();
  app.add_option("--exchange", o.exchange, "dense | sparse | auto")
      ->check(CLI::IsMember({"dense", "sparse", "auto"}))
      ->capture_default_str();
  app.add_option("--collective", o.collective, "Sparse: balanced | equal | allgather")
      ->check(CLI::IsMember({"balanced", "equal", "allgather"}))
      ->capture_default_str();
  app.add_option("--density", o.density, "Sparse: fraction of each tensor's gradients sent per step")
      ->check(CLI::Range(1e-6, 1.0))
      ->capture_default_str();
  app.add_option("--warmup-steps", o.warmup_steps, "Density warm-up steps (0: none)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--warmup-start", o.warmup_start, "The density of step 0 under warm-up")
      ->check(CLI::Range(1e-6, 1.0))
      ->capture_default_str();
  app.add_option("--index-form", o.index_form,
                 "Sparse, balanced or equal: plain uint32 indices, or bucketed (16-bit offsets + counts per 2^16)")
      ->check(CLI::IsMember({"plain", "bucketed"}))
      ->capture_default_str();
  app.add_option("--reselect", o.reselect,
                 "Sparse, balanced or equal: each slice owner keeps this fraction of its sums, the largest "
                 "(1: all; 1/ranks: about one rank's selection in all)")
      ->check(CLI::Range(1e-6, 1.0))
      ->capture_default_str();
  app.add_option("--momentum", o.momentum, "Momentum correction factor (0: residual accumulation alone)")
      ->check(CLI::Range(0.0, 0.999))
      ->capture_default_str();
  app.add_option("--dense-steps", o.dense_steps, "Sparse: the first steps exchange densely (the optimizer's warm-up)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--frozen-variance", o.frozen_variance,
               "Sparse, after --dense-steps: exchange each rank's AdamW velocity by top-k with error feedback and "
               "step with AdamW's second moment frozen (1-bit Adam's recipe; dp/gradient_exchanger.h says why)");
  app.add_flag("--rank-by-step", o.rank_by_step,
               "With --frozen-variance: select the entries whose unsent velocity would move their weights most, "
               "|r| / (sqrt(v) + eps) with AdamW's frozen v, instead of the largest |r|");
  app.add_option("--frozen-max-step", o.frozen_max_step,
                 "With --frozen-variance: the largest step of a coordinate, in units of lr (0: 1 / (density x "
                 "reselect), the steps an exchanged entry stands for; inf: uncapped)")
      ->check(CLI::Validator(
          [](const std::string& text) {
            const double v = std::strtod(text.c_str(), nullptr);
            return v == 0 || v >= 1 ? std::string() : std::string("must be 0 or >= 1");
          },
          "0 or >= 1"))
      ->capture_default_str();
  app.add_option("--model-hosts", o.model_hosts,
                 "Model this many hosts: consecutive groups of ranks get their own NCCL_HOSTID, so NCCL uses "
                 "its network transport between groups (NCCL_NET=Socket for sockets) and NVLink inside them")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--probe-steps", o.probe_steps, "auto: steps that time both exchanges")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--steps", o.steps, "Training steps")->check(CLI::Range(1, 1000000))->capture_default_str();
  app.add_option("--pool", o.pool, "Batches per rank, cycled")->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--skip", o.skip, "Steps the summary's medians leave out")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--lr", o.lr, "AdamW learning rate")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_option("--lr-warmup", o.lr_warmup, "Steps of linear learning-rate warm-up (0: none)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--echo", o.echo, "Data whose second segment repeats the first (models/mlm_data.h): learnable");
  app.add_option("--seed", o.seed, "Weights, data and dropout seed")->capture_default_str();
  app.add_option("--print-every", o.print_every, "Rank 0 prints every this many steps (0: never)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--json", o.json, "Rank 0 writes the record here");
  app.add_option("--label", o.label, "Label written into the record");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (o.frozen_variance && o.momentum > 0) {
    std::fprintf(stderr, "fusekit-dp: --frozen-variance takes AdamW's beta1 as its momentum; leave --momentum out\n");
    return 2;
  }
  if (o.label.find('"') != std::string::npos || o.label.find('\\') != std::string::npos) {
    std::fprintf(stderr, "fusekit-dp: --label must not hold quotes or backslashes\n");
    return 2;
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusekit-dp: %s\n", e.what());
    return 1;
  }
}

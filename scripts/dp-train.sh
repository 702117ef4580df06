#!/usr/bin/env bash
# Data-parallel BERT training runs on a GPU machine: builds fusekit-dp, then runs it once per RUN
# on RANKS GPUs over one transport, one process per GPU (torchrun --no-python, else mpirun), and
# prints each run's summary. Each run's JSON record lands in $OUT as <transport>-<ranks>-<run>.json.
#   bash scripts/dp-train.sh RANKS TRANSPORT STEPS RUN...
#     TRANSPORT  nvlink (NCCL's default: NVLink/P2P and shared memory inside the host), socket
#                (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1: the network path, as between hosts), or
#                hosts:<H> (H hosts modelled: consecutive groups of ranks with their own NCCL_HOSTID,
#                NVLink inside a group, NCCL_NET=Socket between groups; fusekit-dp --model-hosts H)
#     RUN        dense | sparse:<density>[:<collective>[:<keep>[:<index form>]]] | auto:<density> |
#                frozen:<density>:<dense steps>[:<collective>[:<keep>[:<index form>]]] |
#                ddp:<hook> (the PyTorch peer scripts/peers/dp_bert_ddp.py: none, fp16 or powersgd);
#                keep < 1 re-selects each slice's largest sums (fusekit-dp --reselect), index form
#                plain or bucketed (--index-form), e.g. sparse:0.01:balanced:0.25:bucketed; frozen is
#                sparse after that many dense steps, exchanging AdamW's velocity with its second
#                moment frozen (--dense-steps N --frozen-variance)
# Environment: OUT (default out/dp-train), FUSEKIT_DP_ARGS (more fusekit-dp options, e.g.
# "--model bert-tiny --batch 8"), FUSEKIT_DP_TAG (appended to the runs' names, for runs that differ
# by FUSEKIT_DP_ARGS alone), FUSEKIT_DP_TRACE=1 (each run under `fusekit trace` into
# $OUT/<name>.db: every rank's kernels, NCCL's included, and the ranges bert.step > bert.forward,
# bert.backward, bert.exchange (> dp.select, dp.plan, dp.reduce_scatter, dp.reselect, dp.count,
# dp.gather, dp.narrow), bert.optimizer; then its GPU time by kernel category and range, and the
# exchange phases' wall times, are printed; take few steps, tracing slows launches), FUSEKIT_DP_TIMEOUT (seconds a run, default 300), BUILD_DIR.
# Exit code: 0 when every run exited 0.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ $# -lt 4 ]; then
  echo "usage: bash scripts/dp-train.sh RANKS nvlink|socket|hosts:H STEPS RUN... (RUN: dense, sparse:0.01, auto:0.01, ddp:powersgd)" >&2
  exit 2
fi
ranks=$1 transport=$2 steps=$3
shift 3
OUT="${OUT:-$ROOT/out/dp-train}"
mkdir -p "$OUT"
export BUILD_DIR="${BUILD_DIR:-$ROOT/build-device}"
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
timeout_s="${FUSEKIT_DP_TIMEOUT:-300}"
hosts_args=()
case "$transport" in
  nvlink) unset NCCL_P2P_DISABLE NCCL_SHM_DISABLE ;;
  socket) export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 ;;
  hosts:*)
    if ! [[ $transport =~ ^hosts:([2-9]|[1-9][0-9]+)$ ]]; then
      echo "dp-train: hosts:<H> needs H >= 2, not '$transport'" >&2
      exit 2
    fi
    unset NCCL_P2P_DISABLE NCCL_SHM_DISABLE
    export NCCL_NET=Socket
    hosts_args=(--model-hosts "${transport#hosts:}")
    transport="hosts${transport#hosts:}" ;;  # in file names
  *) echo "dp-train: transport must be nvlink, socket or hosts:<H>, not '$transport'" >&2; exit 2 ;;
esac
cd "$ROOT" || exit 1

targets="fusekit-dp"
needed=("$BUILD_DIR/fusekit-dp")
if [ "${FUSEKIT_DP_TRACE:-0}" = 1 ]; then
  targets="fusekit-dp fusekit"
  needed+=("$BUILD_DIR/fusekit")
fi
missing=0
for binary in "${needed[@]}"; do [ -x "$binary" ] || missing=1; done
if [ $missing = 1 ] || [ "${FUSEKIT_DP_REBUILD:-1}" = 1 ]; then
  start=$SECONDS
  if ! FUSEKIT_TARGETS="$targets" bash scripts/setup.sh >"$OUT/build.log" 2>&1 || [ ! -x "$BUILD_DIR/fusekit-dp" ]; then
    grep -B2 -A12 -E "error|Error" "$OUT/build.log" | head -40
    echo "dp-train: the build failed or left fusekit-dp out (NCCL not found?); see $OUT/build.log" >&2
    exit 1
  fi
  echo "dp-train: built fusekit-dp in $((SECONDS - start)) s"
fi

launch=()
if command -v torchrun >/dev/null; then
  launch=(torchrun --standalone "--nproc-per-node=$ranks")
elif python3 -c 'import torch.distributed.run' 2>/dev/null; then
  launch=(python3 -m torch.distributed.run --standalone "--nproc-per-node=$ranks")
fi

# fusekit-dp's rendezvous listens on MASTER_PORT + 1 under torchrun, which another socket of the
# machine may hold; a port the kernel reports free, taken per run, avoids that (unless the caller
# set FUSEKIT_RENDEZVOUS_PORT).
fixed_port="${FUSEKIT_RENDEZVOUS_PORT:-}"
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])' 2>/dev/null
}
failed=0
for spec in "$@"; do
  port="${fixed_port:-$(free_port)}"
  if [ -n "$port" ]; then export FUSEKIT_RENDEZVOUS_PORT=$port; fi
  IFS=: read -r kind a b c d e <<<"$spec"
  name="$transport-$ranks-${spec//:/-}${FUSEKIT_DP_TAG:+-$FUSEKIT_DP_TAG}"
  json="$OUT/$name.json"
  args=(--steps "$steps" --json "$json" --label "$name")
  [ "$kind" = ddp ] || args+=("${hosts_args[@]}")
  case "$kind" in
    dense) program=("$BUILD_DIR/fusekit-dp" --exchange dense) ;;
    sparse) program=("$BUILD_DIR/fusekit-dp" --exchange sparse --density "$a" --collective "${b:-balanced}"
      --reselect "${c:-1}" --index-form "${d:-plain}") ;;
    frozen)
      if [ -z "$b" ]; then echo "dp-train: '$spec' needs its dense steps (frozen:<density>:<steps>)" >&2; failed=1; continue; fi
      program=("$BUILD_DIR/fusekit-dp" --exchange sparse --density "$a" --dense-steps "$b"
        --frozen-variance --collective "${c:-balanced}" --reselect "${d:-1}" --index-form "${e:-plain}") ;;
    auto) program=("$BUILD_DIR/fusekit-dp" --exchange auto --density "$a" --collective "${b:-balanced}") ;;
    ddp) program=(scripts/peers/dp_bert_ddp.py --hook "$a") ;;
    *) echo "dp-train: unknown run '$spec'" >&2; failed=1; continue ;;
  esac
  if [ "$kind" = ddp ]; then
    [ ${#launch[@]} -gt 0 ] || { echo "dp-train: $spec needs torchrun"; failed=1; continue; }
    [ ${#hosts_args[@]} = 0 ] || { echo "dp-train: $spec does not model hosts; run it over nvlink or socket"; failed=1; continue; }
    command=("${launch[@]}" "${program[@]}" "${args[@]}")
  else
    # shellcheck disable=SC2206
    extra=(${FUSEKIT_DP_ARGS:-})
    if [ ${#launch[@]} -gt 0 ]; then
      command=("${launch[@]}" --no-python "${program[@]}" "${args[@]}" "${extra[@]}")
    elif command -v mpirun >/dev/null; then
      command=(mpirun --allow-run-as-root -np "$ranks" -x MASTER_ADDR=127.0.0.1 -x "MASTER_PORT=$((20000 + RANDOM % 20000))"
        "${program[@]}" "${args[@]}" "${extra[@]}")
    else
      echo "dp-train: neither torchrun nor mpirun found"; exit 1
    fi
  fi
  if [ "${FUSEKIT_DP_TRACE:-0}" = 1 ]; then
    rm -f "$OUT/$name.db"
    command=("$BUILD_DIR/fusekit" trace --db "$OUT/$name.db" --label "$name" -- "${command[@]}")
  fi
  start=$SECONDS
  timeout --kill-after=20 "$timeout_s" "${command[@]}" >"$OUT/$name.log" 2>&1
  rc=$?
  [ $rc = 0 ] || failed=1
  echo "== $name: rc $rc in $((SECONDS - start)) s"
  sed -E 's/^\[rank[0-9]+\]://' "$OUT/$name.log" | grep -E 'summary|parameters after|non-finite|error|Error|rank.*fail|auto:' | head -8
  if [ "${FUSEKIT_DP_TRACE:-0}" = 1 ] && [ -f "$OUT/$name.db" ]; then
    "$BUILD_DIR/fusekit" summary --db "$OUT/$name.db" --categories --range bert.step | head -40
    # The exchange's phases (dp.select, dp.plan, dp.reduce_scatter, dp.reselect, dp.count, dp.gather,
    # dp.narrow): wall time per range, every rank's instances together.
    "$BUILD_DIR/fusekit" summary --db "$OUT/$name.db" --range bert.exchange --top 5 |
      sed -n '/NVTX range summary/,$p' | grep -E 'Wall|----|bert\.exchange|dp\.' | head -12
  fi
done
exit $failed

#!/usr/bin/env bash
# Sets up, builds and runs the main job: benchmarks and traces the operator suite (with PyTorch eager
# and torch.compile as peers where python3 has torch) into out/fusekit.db and writes its reports.
# Without a GPU it says so and renders the reports of the shipped evidence (evidence/<gpu>/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup.sh"
cd "$ROOT"  # OUT_DIR is relative to the repository, and so are the paths of the recorded command line
FUSEKIT="$BUILD_DIR/fusekit"
OUT_DIR="${OUT_DIR:-out}"
mkdir -p "$OUT_DIR"

if ! nvidia-smi -L >/dev/null 2>&1; then
  # evidence/<gpu>/ holds the newest store of each suite (.db, or .db.xz as scripts/compact_store.py
  # writes them): each is rendered as HTML, Markdown and CSV, with one line said about it.
  echo "fusekit: no GPU on this machine: rendering the shipped evidence instead of measuring"
  found=0
  index_entries=()
  for db in "$ROOT"/evidence/*/*.db "$ROOT"/evidence/*/*.db.xz; do
    [ -e "$db" ] || continue
    found=1
    source_path="${db#"$ROOT"/}"
    name="$(basename "$(dirname "$db")")-$(basename "${db%.xz}" .db)"
    if [[ "$db" == *.xz ]]; then
      command -v xz >/dev/null || { echo "fusekit: xz is missing: skipping $source_path"; continue; }
      xz -dc "$db" >"$OUT_DIR/$name.db"
      db="$OUT_DIR/$name.db"
    fi
    # Every run of the store: the latest as <gpu>-<suite>.html, an earlier one (a store may hold a
    # second run, e.g. the same suite in another dtype) as <gpu>-<suite>-run<id>.html.
    runs="$(python3 -c 'import sqlite3, sys
print(" ".join(str(r[0]) for r in sqlite3.connect(sys.argv[1]).execute("SELECT id FROM runs ORDER BY id")))' "$db" 2>/dev/null)" ||
      runs=""
    [ -n "$runs" ] || runs="latest"
    latest="${runs##* }"
    pages=()
    for run in $runs; do
      page="$name"
      run_args=()
      if [ "$run" != latest ]; then
        run_args=(--run "$run")
        [ "$run" = "$latest" ] || page="$name-run$run"
      fi
      for format in html md csv; do
        "$FUSEKIT" report --db "$db" "${run_args[@]}" --format "$format" -o "$OUT_DIR/$page.$format" >/dev/null
      done
      pages+=("$OUT_DIR/$page.html")
      index_entries+=("$page.html=$db${run_args:+#$run}")
    done
    echo "fusekit: $source_path -> ${pages[*]} (and .md, .csv)"
  done
  [ "$found" = 1 ] || echo "fusekit: no evidence store found under evidence/"
  "$FUSEKIT" index -o "$OUT_DIR/index.html" "${index_entries[@]}"
  echo "fusekit: open $OUT_DIR/index.html: every report with its suite, GPU, commit and date"
  exit 0
fi

DB="$OUT_DIR/fusekit.db"
peers=()
python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null &&
  peers=(--peers scripts/peers/ops.py)
# FUSEKIT_SUITE_DTYPE=fp16 runs the suite in one dtype (about half the time); default: fp16 and bf16.
dtype=()
[ -n "${FUSEKIT_SUITE_DTYPE:-}" ] && dtype=(--dtype "$FUSEKIT_SUITE_DTYPE")
# FUSEKIT_SUITE=attention runs the attention suite instead of the operator suite (default: ops).
# FUSEKIT_SUITE_OPS=layernorm,linear runs only those operators of the suite; default: all.
[ -n "${FUSEKIT_SUITE_OPS:-}" ] && dtype+=(--ops "$FUSEKIT_SUITE_OPS")
"$FUSEKIT" bench --suite "${FUSEKIT_SUITE:-ops}" "${dtype[@]}" "${peers[@]}" --db "$DB" --label "scripts/run.sh" --reps 30 --warmup 5 \
  --traced-reps 3
"$FUSEKIT" summary --db "$DB" --top 15 --short-names
"$FUSEKIT" report --db "$DB" --format html -o "$OUT_DIR/report.html"
"$FUSEKIT" report --db "$DB" --format csv -o "$OUT_DIR/cases.csv"
"$FUSEKIT" report --db "$DB" --format md -o "$OUT_DIR/report.md"
"$FUSEKIT" export --db "$DB" -o "$OUT_DIR/trace.json"
"$FUSEKIT" index -o "$OUT_DIR/index.html" "report.html=$DB"
echo "fusekit: wrote $DB, report.html, cases.csv, report.md, trace.json (Perfetto) and index.html in $OUT_DIR"

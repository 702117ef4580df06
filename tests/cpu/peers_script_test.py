"""The peers' side of the protocol, without torch: the listing that `fusekit cases` prints reads back
through scripts/peers/ops/cases.py, every listed operator has its peer module, the result lines are
what fusekit's parser takes, and the peer scripts hold no store writer, shape list or byte formula.

usage: peers_script_test.py FUSEKIT SCRIPTS_PEERS_DIR
"""
import builtins
import json
import os
import py_compile
import re
import subprocess
import symtable
import sys
import tempfile

fusekit, peers_dir = sys.argv[1], sys.argv[2]
sys.path.insert(0, peers_dir)
from ops.cases import parse_cases, parse_gpu_conditions, read_cases, result_line  # noqa: E402

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)


def listing(*args):
    return subprocess.run([fusekit, "cases", *args], check=True, capture_output=True, text=True).stdout


# Every case of every suite: names as fusekit builds them, and a peer module for every operator.
for suite in ("ops", "attention", "models"):
    cases = parse_cases(listing("--suite", suite), suite)
    check(len(cases) > 0, f"{suite}: no cases listed")
    for case in cases:
        direction = "fwd+bwd" if case.backward else "fwd"
        check(case.name == f"{case.op}/{case.shape}/{case.dtype}/{direction}", f"{case.name}: name not built from parts")
        # Operators count bytes that must move; a whole training step (suite models) counts flops.
        check(case.bytes > 0 or (suite == "models" and case.flops > 0), f"{case.name}: no bytes or flops")
        check(os.path.exists(os.path.join(peers_dir, "ops", f"{case.op}.py")), f"{case.op}: no peer module")

# One case, from a file, as bench hands it over; flops where fusekit counts them.
with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "cases.json")
    subprocess.run([fusekit, "cases", "--op", "linear", "--shape", "8192x768x3072:bias", "--dtype", "fp16",
                    "--backward", "-o", path], check=True)
    [case] = read_cases(path)
    check(case.name == "linear/8192x768x3072:bias/fp16/fwd+bwd", f"one case: {case.name}")
    check(case.backward and case.flops == 2.0 * 8192 * 768 * 3072 * 3, f"one case: {case}")

# A bad listing is one clear error.
for text in ("{", "{}", '[{"name": "a"}]', '[{"name": "a", "op": "a", "shape": "1", "dtype": "fp16", '
                                             '"direction": "back", "bytes": 1, "flops": 0}]'):
    try:
        parse_cases(text, "listing")
        failures.append(f"no error for listing {text!r}")
    except ValueError as e:
        check(str(e).startswith("listing: "), f"error does not name its source: {e}")

# A result line: one JSON object with exactly the fields fusekit's parser takes (suites/peers.h).
line = result_line("layernorm/8192x768/fp16/fwd", "peer:eager", [31000.5, 30999])
check(line.endswith("\n") and line.count("\n") == 1, "a result is not one line")
check(json.loads(line) == {"name": "layernorm/8192x768/fp16/fwd", "variant": "peer:eager",
                           "samples_ns": [31000.5, 30999.0]}, f"result line: {line}")

# The scripts compile, write no store, and keep no shape lists, operator lists or byte formulas.
scripts = [os.path.join(peers_dir, "ops.py")] + [os.path.join(peers_dir, "ops", f)
                                                for f in sorted(os.listdir(os.path.join(peers_dir, "ops")))
                                                if f.endswith(".py")]
# The GPU conditions around a peer's samples, from nvidia-smi's CSV, under the runner's metric names.
conditions = parse_gpu_conditions("1980, 2619, 41, 312.45, 0x0000000000000004\n", "start")
check(conditions == {"gpu.sm_clock_mhz.start": 1980.0, "gpu.memory_clock_mhz.start": 2619.0,
                     "gpu.temperature_c.start": 41.0, "gpu.power_w.start": 312.45,
                     "gpu.clocks_event_reasons.start": 4.0}, f"gpu conditions parsed as {conditions}")
for bad in ("", "1980, 2619, 41", "1980, 2619, 41, [N/A], 0x0"):
    check(parse_gpu_conditions(bad, "end") == {}, f"gpu conditions from {bad!r} are not empty")
with open(os.path.join(peers_dir, "..", "..", "profiler", "gpu_conditions.cpp"), encoding="utf-8") as f:
    runner_names = set(re.findall(r'"gpu\.([a-z_]+)\." \+ point', f.read()))
check(runner_names >= {name.split(".")[1] for name in conditions},
      f"the peers' condition names {sorted(conditions)} are not the runner's ({sorted(runner_names)})")

for script in scripts:
    py_compile.compile(script, cfile=os.path.join(tempfile.gettempdir(), "peers_script_test.pyc"), doraise=True)
    text = open(script, encoding="utf-8").read()
    for pattern in (r"\bsqlite3\b", r"\bSHAPES\b", r"\bOPERATORS\b", r"\bbytes_moved\b", r"INSERT INTO"):
        check(re.search(pattern, text) is None, f"{os.path.basename(script)}: holds {pattern}")



# Every global name a function of a script reads is defined in its module (a def, an import, an
# assignment) or is a builtin: without torch the scripts cannot run here, and a call of a function
# that does not exist would fail every case on the GPU machine.
def module_names(table):
    names = set()
    for symbol in table.get_symbols():
        if symbol.is_assigned() or symbol.is_imported() or symbol.is_namespace():
            names.add(symbol.get_name())
    return names


def undefined_globals(table, defined):
    missing = set()
    for symbol in table.get_symbols():
        if symbol.is_global() and symbol.is_referenced() and symbol.get_name() not in defined:
            missing.add(symbol.get_name())
    for child in table.get_children():
        missing |= undefined_globals(child, defined)
    return missing


for script in scripts:
    top = symtable.symtable(open(script, encoding="utf-8").read(), script, "exec")
    defined = module_names(top) | set(dir(builtins)) | {"__file__", "__name__", "__doc__", "__spec__", "__package__"}
    missing = set()
    for child in top.get_children():
        missing |= undefined_globals(child, defined)
    check(not missing, f"{os.path.basename(script)}: undefined names {sorted(missing)}")

for failure in failures:
    print("FAIL:", failure)
print(f"peers_script_test: {'FAILED' if failures else 'passed'}")
sys.exit(1 if failures else 0)

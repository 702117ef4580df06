"""The peers' side of fusekit's protocol (suites/peers.h), without torch: the listing of cases that
fusekit hands over (`fusekit cases`, a JSON array of objects), and the result lines handed back, one
JSON object per case and variant, which fusekit checks and writes into its store."""
import json
import subprocess
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class ListedCase:
    """One case as fusekit lists it; the peers time it under this name."""
    name: str        # "<op>/<shape>/<dtype>/<fwd|fwd+bwd>"
    op: str
    shape: str       # the operator's shape syntax (suites/ops/<op>.cpp)
    dtype: str       # fp32 | fp16 | bf16
    backward: bool   # direction "fwd+bwd"
    bytes: float     # bytes that must move, as fusekit counts them
    flops: float     # floating-point operations (0: not counted)


def parse_cases(text: str, source: str) -> list:
    """The cases of a listing; ValueError naming `source` on anything else."""
    try:
        listing = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{source}: not a JSON listing of cases: {e}") from None
    if not isinstance(listing, list):
        raise ValueError(f"{source}: expected a JSON array of cases")
    cases = []
    for i, entry in enumerate(listing):
        try:
            if entry["direction"] not in ("fwd", "fwd+bwd"):
                raise ValueError(f"direction {entry['direction']!r}")
            cases.append(ListedCase(str(entry["name"]), str(entry["op"]), str(entry["shape"]), str(entry["dtype"]),
                                    entry["direction"] == "fwd+bwd", float(entry["bytes"]), float(entry["flops"])))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{source}: case {i + 1}: bad or missing field {e}") from None
    return cases


def read_cases(path: str) -> list:
    """The listing in the file at `path`, or on standard input for "-"."""
    if path == "-":
        return parse_cases(sys.stdin.read(), "standard input")
    with open(path, encoding="utf-8") as f:
        return parse_cases(f.read(), path)


def result_line(name: str, variant: str, samples_ns: list, metrics: dict = None) -> str:
    """One result: the case's name, its variant ("peer:eager"), every sample in nanoseconds, and
    optionally named numbers measured once ({"peak_memory_bytes": ...})."""
    result = {"name": name, "variant": variant, "samples_ns": [float(s) for s in samples_ns]}
    if metrics:
        result["metrics"] = {key: float(value) for key, value in metrics.items()}
    return json.dumps(result) + "\n"


# The GPU conditions a case was timed under, as fusekit's runner records them for its own variants
# (profiler/gpu_conditions.h: case metrics "gpu.<name>.<start|end>"), read here through nvidia-smi
# (NVML underneath) so that the gate compares the peers' conditions too.
SMI_FIELDS = ("clocks.sm", "clocks.mem", "temperature.gpu", "power.draw", "clocks_event_reasons.active")
SMI_FIELDS_OLD = SMI_FIELDS[:4] + ("clocks_throttle_reasons.active",)  # drivers before 535
CONDITION_NAMES = ("sm_clock_mhz", "memory_clock_mhz", "temperature_c", "power_w", "clocks_event_reasons")


def parse_gpu_conditions(line: str, point: str) -> dict:
    """One line of `nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits` as the metrics
    {"gpu.<name>.<point>": value}; {} where it does not parse (a field [N/A], another layout)."""
    parts = [p.strip() for p in line.strip().split(",")]
    if len(parts) != len(CONDITION_NAMES):
        return {}
    try:
        values = [float(p) for p in parts[:4]] + [float(int(parts[4], 16))]
    except ValueError:
        return {}
    return {f"gpu.{name}.{point}": value for name, value in zip(CONDITION_NAMES, values)}


def gpu_conditions(pci_bus_id: str, point: str) -> dict:
    """The conditions of the GPU at `pci_bus_id` ("00000000:1B:00.0") now; {} without nvidia-smi."""
    for fields in (SMI_FIELDS, SMI_FIELDS_OLD):
        try:
            out = subprocess.run(["nvidia-smi", f"--id={pci_bus_id}", "--query-gpu=" + ",".join(fields),
                                  "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return {}
        if out.returncode == 0 and out.stdout.strip():
            return parse_gpu_conditions(out.stdout.splitlines()[0], point)
    return {}

"""scripts/dp_report.py: runs are compared within their batch (a directory, or the batches a
--json file holds), losses fall back to another batch's dense run of the same group and say so,
a --json file reads back as a source, and two sources of one batch name are refused."""
import json
import lzma
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "dp_report.py")


def record(exchange, step_ms, comm_ms, losses, density=0.01, echo=False, extra=None):
    r = {"label": exchange, "ranks": 4, "exchange": exchange, "collective": "balanced", "density": density,
         "lr": 1e-4, "lr_warmup": 0, "echo": echo, "nccl_p2p_disable": "1", "decision": exchange,
         "summary": {"step_ms": step_ms, "communication_ms": comm_ms, "compute_ms": 12.0, "selection_ms": 0.0,
                     "narrow_ms": 0.0, "bytes_per_rank_mean": 1e6, "bytes_per_rank_max": 1e6,
                     "same_parameters": True},
         "steps": [{"loss": x} for x in losses]}
    r.update(extra or {})
    return r


def write_batch(root, name, records):
    path = os.path.join(root, name)
    os.makedirs(path)
    for i, r in enumerate(records):
        with open(os.path.join(path, f"{i}.json"), "w") as f:
            json.dump(r, f)
    return path


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


class DpReportBase(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp()
        self.out = [os.path.join(self.root, n) for n in ("dp.md", "dp.csv", "dp.json")]

    def report(self, *sources):
        result = run(*sources, "--md", self.out[0], "--csv", self.out[1], "--json", self.out[2])
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(self.out[0]) as f:
            return f.read()

    def rows(self, md):
        return [line for line in md.splitlines() if line.startswith("| b") and not line.startswith("| batch")]


class DpReportTest(DpReportBase):
    def test_times_stay_in_their_batch_and_losses_say_where_they_come_from(self):
        a = write_batch(self.root, "ba", [record("dense", 100.0, 90.0, [10.0] * 10),
                                          record("sparse", 20.0, 9.0, [10.5] * 10)])
        b = write_batch(self.root, "bb", [record("dense", 50.0, 40.0, [10.0] * 20),
                                          record("sparse", 25.0, 10.0, [11.0] * 10, extra={"frozen_variance": True,
                                                                                      "dense_steps": 3,
                                                                                      "frozen_max_step": 0,
                                                                                      "momentum": 0.9})])
        md = self.report(a, b)
        rows = {(r.split(" | ")[0][2:], r.split(" | ")[5]): r for r in self.rows(md)}
        # Batch ba: 100 / 20 = 5x the step, 90 / 9 = 10x the communication, loss +5% of its own dense.
        sparse_a = rows[("ba", "sparse 0.01 balanced")]
        self.assertIn("| 5.00x | 10.0x |", sparse_a)
        self.assertIn("+5.00% |", sparse_a)
        # Batch bb's sparse run: its dense run has 20 steps, not 10, so no loss group in bb; times
        # against bb's dense (50 / 25), never ba's; the loss against ba's dense, named.
        sparse_b = [r for (batch, run_name), r in rows.items() if batch == "bb" and run_name.startswith("sparse")]
        self.assertEqual(len(sparse_b), 1)
        self.assertIn("velocity exchange with AdamW's variance frozen after 3 dense steps, "
                      "step cap 1/(density x keep) lr", sparse_b[0])
        self.assertIn("| 2.00x | 4.0x |", sparse_b[0])
        self.assertIn("+10.00% (ba) |", sparse_b[0])

    def test_a_run_ranked_by_step_is_named_apart_from_the_plain_ranking(self):
        frozen = {"frozen_variance": True, "dense_steps": 60, "frozen_max_step": 0}
        a = write_batch(self.root, "ba", [record("dense", 100.0, 90.0, [10.0] * 10),
                                          record("sparse", 20.0, 9.0, [10.4] * 10, extra=dict(frozen)),
                                          record("sparse", 21.0, 9.0, [10.2] * 10,
                                                 extra=dict(frozen, rank_by_step=True))])
        runs = [r.split(" | ")[5] for r in self.rows(self.report(a))]
        ranked = [run for run in runs if run.endswith(", ranked by step")]
        self.assertEqual(len(ranked), 1)
        self.assertEqual(len(set(runs)), 3)

    def test_the_json_reads_back_as_a_source_and_batch_names_do_not_collide(self):
        a = write_batch(self.root, "ba", [record("dense", 100.0, 90.0, [10.0] * 10)])
        self.report(a)
        packed = os.path.join(self.root, "earlier.json.xz")
        with open(self.out[2]) as f, lzma.open(packed, "wt") as g:
            g.write(f.read())
        b = write_batch(self.root, "bb", [record("dense", 50.0, 40.0, [10.0] * 10)])
        md = self.report(packed, b)
        self.assertEqual(sorted(r.split(" | ")[0][2:] for r in self.rows(md)), ["ba", "bb"])
        again = os.path.join(self.root, "again")
        os.makedirs(again)
        collide = write_batch(again, "ba", [record("dense", 1.0, 1.0, [1.0] * 10)])
        result = run(packed, collide, "--md", self.out[0], "--csv", self.out[1], "--json", self.out[2])
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("batch 'ba' comes from both", result.stderr)
        self.assertEqual(len(result.stderr.strip().splitlines()), 1)


class DpReportConfigTest(DpReportBase):
    def test_each_model_against_its_own_dense_run_and_no_two_dense_runs_of_one_group(self):
        tiny = {"config": "bert-tiny:b8:s128:fp16"}
        base = {"config": "bert-base:b64:s128:fp16"}
        a = write_batch(self.root, "ba", [record("dense", 100.0, 90.0, [10.0] * 10, extra=base),
                                          record("sparse", 20.0, 9.0, [10.0] * 10, extra=base),
                                          record("dense", 10.0, 8.0, [5.0] * 10, extra=tiny),
                                          record("sparse", 5.0, 2.0, [5.5] * 10, extra=tiny)])
        md = self.report(a)
        sparse = sorted(r for r in self.rows(md) if "| sparse" in r)
        self.assertEqual(len(sparse), 2)
        self.assertTrue(any("| 5.00x | 10.0x |" in r and "+0.00%" in r for r in sparse), sparse)  # base
        self.assertTrue(any("| 2.00x | 4.0x |" in r and "+10.00%" in r for r in sparse), sparse)  # tiny
        # Modelled hosts are a link of their own: compared with their own dense run, not the socket one.
        hosts = dict(base, model_hosts=2, nccl_net="Socket", nccl_p2p_disable="")
        c = write_batch(self.root, "bc", [record("dense", 100.0, 90.0, [10.0] * 10, extra=base),
                                          record("dense", 60.0, 50.0, [10.0] * 10, extra=hosts),
                                          record("sparse", 20.0, 10.0, [10.0] * 10, extra=hosts)])
        md = self.report(c)
        modelled = [r for r in self.rows(md) if "| 2 hosts, socket |" in r and "| sparse" in r]
        self.assertEqual(len(modelled), 1, md)
        self.assertIn("| 3.00x | 5.0x |", modelled[0])
        # Two dense runs of one group: which one a ratio would use is arbitrary, so none is given.
        b = write_batch(self.root, "bb", [record("dense", 100.0, 90.0, [10.0] * 10, extra=base),
                                          record("dense", 90.0, 80.0, [10.0] * 10, extra=base),
                                          record("sparse", 20.0, 9.0, [10.0] * 10, extra=base)])
        result = run(b, "--md", self.out[0], "--csv", self.out[1], "--json", self.out[2])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("two dense runs of one group", result.stderr)
        with open(self.out[0]) as f:
            sparse = [r for r in self.rows(f.read()) if "| sparse" in r]
        self.assertEqual(len(sparse), 1)
        self.assertNotIn("x |", sparse[0].split("| 1.000 |")[-1])  # no step speedup, no reduction


if __name__ == "__main__":
    unittest.main()

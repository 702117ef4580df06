"""scripts/touched_ops.py: which operators a change reaches, on a small kernel tree made here
(includes through headers, sources that name several operators, shared files) and on this
repository's own tree; and scripts/ci-gate.sh's plan in a dry run (no GPU needed)."""
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import touched_ops  # noqa: E402

KNOWN = {"layernorm", "softmax", "window_partition", "window_merge", "linear", "qkv_projection", "bert_step"}


def tree(files):
    root = tempfile.mkdtemp()
    for path, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
        with open(os.path.join(root, path), "w") as f:
            f.write(text)
    return root


class TouchedOpsTest(unittest.TestCase):
    def setUp(self):
        self.root = tree({
            "kernels/layernorm.cu": '#include "kernels/detail/layernorm_common.cuh"\n',
            "kernels/softmax.cu": '#include "kernels/detail/reduce.cuh"\n',
            "kernels/swin_window.cu": '#include "kernels/detail/gathered.cuh"\n',
            "kernels/linear.cu": '#include "kernels/bias_gelu.h"\n',
            "kernels/dtype.cpp": "",
            "kernels/detail/layernorm_common.cuh": '#include "kernels/detail/reduce.cuh"\n',
            "kernels/detail/gathered.cuh": '#  include "kernels/detail/layernorm_common.cuh"\n',
            "kernels/detail/reduce.cuh": "",
            "kernels/bias_gelu.h": "",
        })
        self.graph = touched_ops.include_graph(self.root)

    def touched(self, *paths):
        return touched_ops.touched(paths, KNOWN, self.graph)

    def test_a_header_reaches_every_source_that_includes_it_transitively(self):
        self.assertEqual(self.touched("kernels/detail/reduce.cuh"),
                         "bert_step,layernorm,softmax,window_merge,window_partition")
        self.assertEqual(self.touched("kernels/detail/gathered.cuh"), "bert_step,window_merge,window_partition")

    def test_sources_name_their_operators(self):
        self.assertEqual(self.touched("kernels/linear.cu"), "bert_step,linear,qkv_projection")
        self.assertEqual(self.touched("kernels/bias_gelu.h"), "bert_step,linear,qkv_projection")
        self.assertEqual(self.touched("kernels/dtype.cpp"), "all")
        self.assertEqual(self.touched("kernels/detail/removed.cuh"), "all")

    def test_baselines_cases_peers_and_models(self):
        self.assertEqual(self.touched("baselines/softmax.cpp", "suites/ops/layernorm.cpp"), "layernorm,softmax")
        self.assertEqual(self.touched("scripts/peers/ops/linear.py"), "linear,qkv_projection")
        self.assertEqual(self.touched("models/bert_fused.cpp", "baselines/models/bert_baseline.cpp"), "bert_step")
        self.assertEqual(self.touched("suites/runner.cpp"), "all")
        self.assertEqual(self.touched("scripts/peers/ops/common.py"), "all")
        self.assertEqual(self.touched("baselines/unknown_op.cpp"), "all")

    def test_what_cannot_move_a_timing_reaches_nothing(self):
        self.assertEqual(self.touched("README.md", "reports/html.cpp", "tests/cpu/gate_test.cpp",
                                      "kernels/reference/layernorm.cpp", ""), "")

    def test_this_repository(self):
        graph = touched_ops.include_graph(ROOT)
        known = KNOWN | {"window_attention", "bias_gelu"}
        self.assertEqual(touched_ops.touched(["kernels/detail/window_attention_small.cuh"], known, graph),
                         "bert_step,window_attention")
        self.assertEqual(touched_ops.touched(["kernels/common.cuh"], known, graph), "all")


class CiGateDryRunTest(unittest.TestCase):
    def run_gate(self, *args):
        fusekit = os.environ.get("FUSEKIT_BINARY", os.path.join(ROOT, "build", "fusekit"))
        env = dict(os.environ, BUILD_DIR=os.path.dirname(fusekit), PATH="/usr/bin:/bin")
        return subprocess.run(["bash", os.path.join(ROOT, "scripts", "ci-gate.sh"), "--dry-run",
                               "--out", tempfile.mkdtemp(), *args], capture_output=True, text=True, env=env,
                              cwd=ROOT)

    def test_plans_every_suite_against_the_evidence(self):
        result = self.run_gate("--suites", "ops,attention")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("ops: measure every case (fp16), gate against evidence/h100/ops.db", result.stdout)
        self.assertIn("attention: measure every case (fp16), gate against evidence/h100/attention.db",
                      result.stdout)

    def test_only_some_operators(self):
        result = self.run_gate("--suites", "ops,attention", "--ops", "embedding_layernorm")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("ops: measure --ops embedding_layernorm (fp16), gate against evidence/h100/ops.db",
                      result.stdout)
        self.assertIn("attention: no touched operator", result.stdout)
        unknown = self.run_gate("--ops", "embedding_layernorm,no_such_op")
        self.assertEqual(unknown.returncode, 2)
        self.assertIn("no operator 'no_such_op'", unknown.stderr)

    def test_usage_errors(self):
        self.assertEqual(self.run_gate("--dtype", "fp8").returncode, 2)
        self.assertEqual(self.run_gate("--history-runs", "0").returncode, 2)
        bad = self.run_gate("--base", "no-such-ref-anywhere")
        self.assertEqual(bad.returncode, 2)
        self.assertIn("is not a commit", bad.stderr)
        missing = self.run_gate("--candidate-fusekit", "/no/such/fusekit")
        self.assertEqual(missing.returncode, 2)
        self.assertIn("is not an executable", missing.stderr)
        folder = self.run_gate("--candidate-fusekit", "/tmp")
        self.assertEqual(folder.returncode, 2)
        fusekit = os.environ.get("FUSEKIT_BINARY", os.path.join(ROOT, "build", "fusekit"))
        mixed = self.run_gate("--candidate-fusekit", fusekit, "--history", "h.db")
        self.assertEqual(mixed.returncode, 2)
        self.assertIn("do not belong in --history", mixed.stderr)
        missing_base = self.run_gate("--confirm-against", "/no/such/fusekit")
        self.assertEqual(missing_base.returncode, 2)
        self.assertIn("--confirm-against '/no/such/fusekit' is not an executable", missing_base.stderr)
        both = self.run_gate("--confirm-against", fusekit, "--no-confirm")
        self.assertEqual(both.returncode, 2)
        self.assertIn("cannot go with --no-confirm", both.stderr)

    def test_ab_confirmation_is_planned(self):
        fusekit = os.environ.get("FUSEKIT_BINARY", os.path.join(ROOT, "build", "fusekit"))
        result = self.run_gate("--suites", "ops", "--ops", "embedding_layernorm", "--confirm-against", fusekit)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"ops: a regression is confirmed by two A/B rounds against {fusekit}", result.stdout)


if __name__ == "__main__":
    unittest.main()

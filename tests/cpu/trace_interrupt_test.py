"""`fusekit trace` under SIGTERM: the signal goes on to the traced command, which does not outlive
fusekit, and the run ends "interrupted" with exit code 143, not "running". Sent to fusekit alone (as
a job runner that kills the main process does) and by `timeout`, which signals fusekit and then its
whole process group (so fusekit sees it twice)."""
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

FUSEKIT = os.environ.get("FUSEKIT_BINARY", "build/fusekit")


def wait_for(path, seconds=20.0):
    deadline = time.time() + seconds
    while not os.path.exists(path):
        if time.time() > deadline:
            raise AssertionError(f"{path} never appeared")
        time.sleep(0.05)


class TraceInterruptTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.db = os.path.join(self.dir, "t.db")
        self.started = os.path.join(self.dir, "started")
        self.outlived = os.path.join(self.dir, "outlived")
        # The command says it started, then would leave a mark after 3 s unless the signal reaches it.
        self.command = ["sh", "-c", f"touch {self.started}; sleep 3; touch {self.outlived}"]

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def check_run(self, stderr):
        self.assertIn('ends "interrupted"', stderr)
        summary = subprocess.run([FUSEKIT, "summary", "--db", self.db], capture_output=True, text=True)
        self.assertIn("status interrupted", summary.stdout)
        # sh got the signal before its sleep ended; the mark must never appear.
        time.sleep(3.5)
        self.assertFalse(os.path.exists(self.outlived), "the traced command outlived fusekit")

    def test_sigterm_to_fusekit_alone(self):
        p = subprocess.Popen([FUSEKIT, "trace", "--db", self.db, "--", *self.command], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
        wait_for(self.started)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=20)
        self.assertEqual(p.returncode, 128 + signal.SIGTERM, err)
        self.check_run(err)

    @unittest.skipUnless(shutil.which("timeout"), "no timeout program")
    def test_timeout_signals_fusekit_and_its_group(self):
        # timeout's own exit code is 124; it signals fusekit, then its process group.
        p = subprocess.run(["timeout", "-s", "TERM", "2", FUSEKIT, "trace", "--db", self.db, "--", *self.command],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 124, p.stderr)
        self.check_run(p.stderr)


if __name__ == "__main__":
    unittest.main()

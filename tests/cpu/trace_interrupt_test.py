"""`fusekit trace` under SIGTERM (as `timeout` sends it): the signal goes on to the traced command,
which does not outlive fusekit, and the run ends "interrupted" with exit code 143, not "running"."""
import os
import signal
import subprocess
import tempfile
import time
import unittest

FUSEKIT = os.environ.get("FUSEKIT_BINARY", "build/fusekit")


class TraceInterruptTest(unittest.TestCase):
    def test_sigterm_reaches_the_command_and_the_run_ends_interrupted(self):
        with tempfile.TemporaryDirectory() as d:
            db = os.path.join(d, "t.db")
            marker = os.path.join(d, "outlived")
            # The command would write the marker after 3 s, unless the signal reaches it.
            p = subprocess.Popen([FUSEKIT, "trace", "--db", db, "--", "sh", "-c", f"sleep 3; touch {marker}"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True)
            time.sleep(0.5)
            p.send_signal(signal.SIGTERM)  # to fusekit alone, as timeout does
            _, err = p.communicate(timeout=20)
            self.assertEqual(p.returncode, 128 + signal.SIGTERM, err)
            self.assertIn('ends "interrupted"', err)
            summary = subprocess.run([FUSEKIT, "summary", "--db", db], capture_output=True, text=True)
            self.assertIn("status interrupted", summary.stdout)
            # sh got SIGTERM; its sleep, if any, is left to finish, but the marker must never appear.
            time.sleep(3.5)
            self.assertFalse(os.path.exists(marker), "the traced command outlived fusekit")


if __name__ == "__main__":
    unittest.main()

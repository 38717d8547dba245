"""`python -m torch_aura`, the README's first command, runs and passes its own checks."""

import os
import subprocess
import sys


def test_main_job_runs_on_cpu_and_passes():
    r = subprocess.run([sys.executable, "-m", "torch_aura", "--device", "cpu"], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "TORCH_AURA_STRICT": "1"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for line in ("[decode] flash_decode", "[aura] aura_decode", "[gdn] gdn_chunk", "all checks passed"):
        assert line in r.stdout
    assert "FAIL" not in r.stdout
    assert "x smaller" in r.stdout  # AURA reports the memory saved

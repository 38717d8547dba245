"""`python -m torch_aura`, the README's first command: runs, passes its own checks, puts each family
beside its peer on the same device, and answers bad options with argparse errors."""

import os
import subprocess
import sys
import time


def _main(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "torch_aura", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "TORCH_AURA_STRICT": "1"})


def test_main_job_runs_on_cpu_and_passes():
    t0 = time.perf_counter()
    r = _main("--device", "cpu")
    elapsed = time.perf_counter() - t0
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    rows = {line.split()[0]: line for line in out.splitlines() if line.split()[:1] in (["decode"], ["aura"], ["gdn"])}
    assert set(rows) == {"decode", "aura", "gdn"}, out
    assert "flash_decode" in rows["decode"] and "SDPA" in rows["decode"] and "GB/s" in rows["decode"]
    assert "aura_decode" in rows["aura"] and "SDPA" in rows["aura"] and "x smaller than bf16" in rows["aura"]
    assert "gdn_chunk" in rows["gdn"] and "tokens/s" in rows["gdn"] and "0.00 " not in rows["gdn"]
    assert "FAIL" not in out and "all checks passed" in out
    assert out.count("\n") < 20, "one line per family, not a table per op"
    assert elapsed < 60, f"{elapsed:.0f} s (target: under 30 s on 2 cores)"


def test_bad_options_are_argparse_errors():
    for args, needle in ((["--device", "foo"], "'foo' is not a device"),
                         (["--family", "nope"], "invalid choice"),
                         (["--device", "xla"], "torch_aura runs on cpu, cuda and mps")):
        r = _main(*args)
        assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, (args, r.stderr[-2000:])


def test_status_prints_every_op():
    r = _main("--status")
    assert r.returncode == 0 and "flash_decode" in r.stdout and "gdn_recurrent" in r.stdout

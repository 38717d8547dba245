"""The benchmark scripts run as files and share one harness (docs/style.md §7).

``python benchmarks/bench_<family>.py`` puts ``benchmarks/`` first on ``sys.path``, so the scripts import
``_harness`` and ``shapes`` as siblings: no script edits ``sys.path``, and every timing goes through
``benchmarks/_harness.py`` (``time_us``, ``host_us``, ``timed``, ``median_s``).
"""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
# clocks read outside the harness, each a measurement of its own rather than a second copy of the timer
OWN_CLOCKS = {
    "bench_vllm_cpu.py": "Profile: time summed inside the backend's wrapped stages, not around a call",
    "profile_gdn.py": "eager_loop_split: host and event time of the same call side by side (a diagnosis)",
    "bench_aura_quality.py": "the whole run's duration, printed at the end (it times no kernel)",
}


def _scripts():
    return sorted(p for p in BENCH.glob("*.py"))


def test_no_script_edits_sys_path():
    bad = [f"{p.name}:{i}" for p in _scripts()
           for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"sys\.path\.(insert|append)|sys\.path\[", line)]
    assert not bad, "benchmarks import their siblings as the script's folder allows, never by editing sys.path: " + ", ".join(bad)


def test_one_timer():
    bad = [p.name for p in _scripts()
           if p.name != "_harness.py" and p.name not in OWN_CLOCKS and re.search(r"perf_counter|time\.time\(\)", p.read_text())]
    assert not bad, f"time calls through benchmarks/_harness.py (timed, median_s, host_us, time_us), not a clock of their own: {bad}"


def test_sibling_imports_resolve():
    siblings = {p.stem for p in _scripts()}
    for p in _scripts():
        for mod in re.findall(r"^(?:import|from) (_[a-z]\w*|bench_\w+|profile_\w+|shapes)\b", p.read_text(), re.M):
            assert mod in siblings, f"{p.name} imports {mod}, which is not a file of benchmarks/"


def test_a_script_runs_as_a_file():
    proc = subprocess.run([sys.executable, str(BENCH / "bench_cpu.py"), "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]

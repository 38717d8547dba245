"""Tuned launch configs persist on disk (issue 38): a decision timed once is read back by a later
process instead of being timed again; the shipped table for a GPU is read first and the user's table
over it; a corrupt file is ignored with a warning; ``TORCH_AURA_TUNE_CACHE=0`` writes nothing.

The device is the CPU (its table is ``cpu.json``) and timing is stubbed: what is under test is the
bookkeeping, not ``do_bench``.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("triton")

CPU = torch.device("cpu")


@pytest.fixture
def tune(monkeypatch, tmp_path):
    """``_tune`` with the user table under ``tmp_path/user``, shipped tables under ``tmp_path/shipped``,
    no table read yet, and "timing" that picks the second config and counts its calls."""
    from torch_aura.triton_kernels import _tune

    monkeypatch.setenv(_tune.TUNE_CACHE_ENV, str(tmp_path / "user"))
    monkeypatch.delenv("TORCH_AURA_TUNE", raising=False)
    monkeypatch.setattr(_tune, "SHIPPED_TABLES", tmp_path / "shipped")
    monkeypatch.setattr(_tune, "_TABLES", {})

    def timed(self, launch):
        self.timed += 1
        return self.configs[1]

    monkeypatch.setattr(_tune.Tuner, "_tune", timed)
    return _tune


def _tuner(tune):
    return tune.Tuner("test_kernel", [tune.Config(num_warps=4), tune.Config({"BV": 32}, num_warps=8, num_stages=3),
                                      tune.Config(num_warps=1)])


def _fresh_process(tune, monkeypatch):
    monkeypatch.setattr(tune, "_TABLES", {})
    return _tuner(tune)


KEY = (128, 128, torch.bfloat16, False, True)


def test_a_timed_decision_is_read_back_by_the_next_process(tune, monkeypatch):
    tuner, launched = _tuner(tune), []
    tuner(KEY, launched.append, CPU)
    assert tuner.timed == 1 and launched == [tuner.configs[1]]
    path = tune.user_table_path("cpu")
    data = json.loads(path.read_text())
    assert data["gpu"] == "cpu" and data["tuners"]["test_kernel"] == {
        "128|128|torch.bfloat16|False|True": {"kwargs": {"BV": 32}, "num_warps": 8, "num_stages": 3}}
    again = _fresh_process(tune, monkeypatch)
    again(KEY, launched.append, CPU)
    again((64, 64, torch.float16, True, False), launched.append, CPU)  # another key: timed, appended
    assert again.timed == 1 and launched[1] == again.configs[1]
    assert len(json.loads(path.read_text())["tuners"]["test_kernel"]) == 2


def test_the_shipped_table_is_used_and_the_users_overrides_it(tune, monkeypatch, tmp_path):
    shipped = tmp_path / "shipped" / "cpu.json"
    shipped.parent.mkdir()
    entry = {"kwargs": {}, "num_warps": 1, "num_stages": 2}
    shipped.write_text(json.dumps({"format": 1, "tuners": {"test_kernel": {"128|128|torch.bfloat16|False|True": entry,
                                                                            "1|1|x": {"num_warps": 3}}}}))
    tuner, launched = _tuner(tune), []
    tuner(KEY, launched.append, CPU)
    assert tuner.timed == 0 and launched == [tuner.configs[2]]  # a fresh install never times
    tuner(("1", "1", "x"), launched.append, CPU)  # a config this tuner does not have: timed instead
    assert tuner.timed == 1
    tune.tune_table(CPU).put(tuner, KEY, tuner.configs[0])
    again = _fresh_process(tune, monkeypatch)
    again(KEY, launched.append, CPU)
    assert again.timed == 0 and launched[-1] == again.configs[0]


@pytest.mark.parametrize("text", ["{not json", '{"format": 1}', '{"format": 1, "tuners": {"test_kernel": 3}}',
                                  '{"format": 99, "tuners": {}}'], ids=["syntax", "no-tuners", "bad-rows", "format"])
def test_a_corrupt_table_is_ignored_with_a_warning_and_rewritten(tune, text):
    path = tune.user_table_path("cpu")
    path.parent.mkdir(parents=True)
    path.write_text(text)
    tuner, launched = _tuner(tune), []
    with pytest.warns(UserWarning, match="ignoring the tuned-config table"):
        tuner(KEY, launched.append, CPU)
    assert tuner.timed == 1 and launched == [tuner.configs[1]]
    assert json.loads(path.read_text())["tuners"]["test_kernel"]  # rewritten, valid


def test_the_cache_variable_disables_the_user_table(tune, monkeypatch, tmp_path):
    monkeypatch.setenv(tune.TUNE_CACHE_ENV, "0")
    assert tune.user_table_path("cpu") is None
    tuner = _tuner(tune)
    tuner(KEY, lambda cfg: None, CPU)
    tuner(KEY, lambda cfg: None, CPU)  # remembered in the process all the same
    assert tuner.timed == 1 and not (tmp_path / "user").exists()


def test_untuned_modes_read_no_table(tune, monkeypatch):
    monkeypatch.setenv("TORCH_AURA_TUNE", "0")
    tuner, launched = _tuner(tune), []
    tuner(KEY, launched.append, CPU)
    assert launched == [tuner.configs[0]] and tuner.timed == 0 and tune._TABLES == {}


def _shipped(tmp_path, rows: dict) -> None:
    path = tmp_path / "shipped" / "cpu.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"format": 1, "tuners": {"test_kernel": rows}}))


def _recording(tune):
    """A launch that records (config, the sibling launch options ``_launch`` would compile beside it)."""
    from torch_aura.triton_kernels import _launch

    launched = []
    return launched, lambda cfg: launched.append((cfg, _launch._siblings))


def test_a_bucket_names_its_other_side_as_the_sibling_of_every_launch(tune, tmp_path):
    """The prep kernels' many-chunks bucket: every call on one side launches with the table's other-side
    options as siblings, so each new variant's first launch compiles the other side's too (whatever the
    arguments' dtypes; gdn.md §6.4); the siblings are unset after the call."""
    from torch_aura.triton_kernels import _launch

    few, many = {"kwargs": {}, "num_warps": 4, "num_stages": 2}, {"kwargs": {"BV": 32}, "num_warps": 8, "num_stages": 3}
    _shipped(tmp_path, {"128|128|torch.bfloat16|False|False": few, "128|128|torch.bfloat16|False|True": many})
    tuner = tune.Tuner("test_kernel", _tuner(tune).configs, bucket=4)
    launched, launch = _recording(tune)
    small = (128, 128, torch.bfloat16, False, False)
    tuner(small, launch, CPU)
    tuner(small, launch, CPU)
    tuner(KEY, launch, CPU)  # past the edge: the few side is its sibling
    a, b = tuner.configs[0], tuner.configs[1]
    assert launched == [(a, (b.launch_kwargs(),)), (a, (b.launch_kwargs(),)), (b, (a.launch_kwargs(),))]
    assert tuner.timed == 0 and _launch._siblings == ()


@pytest.mark.parametrize("other", ["same variant", "not in the table", "no bucket"])
def test_nothing_is_readied_that_a_later_call_would_not_compile(tune, tmp_path, other):
    entry = {"kwargs": {}, "num_warps": 4, "num_stages": 2}
    rows = {"128|128|torch.bfloat16|False|False": entry}
    if other != "not in the table":
        rows["128|128|torch.bfloat16|False|True"] = entry
    _shipped(tmp_path, rows)
    tuner = tune.Tuner("test_kernel", _tuner(tune).configs, bucket=None if other == "no bucket" else 4)
    launched, launch = _recording(tune)
    tuner((128, 128, torch.bfloat16, False, False), launch, CPU)
    assert launched == [(tuner.configs[0], ())]


def test_siblings_are_unset_when_the_launch_raises(tune, tmp_path):
    from torch_aura.triton_kernels import _launch

    few, many = {"kwargs": {}, "num_warps": 4, "num_stages": 2}, {"kwargs": {"BV": 32}, "num_warps": 8, "num_stages": 3}
    _shipped(tmp_path, {"128|128|torch.bfloat16|False|False": few, "128|128|torch.bfloat16|False|True": many})
    tuner = tune.Tuner("test_kernel", _tuner(tune).configs, bucket=4)

    def launch(cfg):
        raise RuntimeError("out of resources")
    with pytest.raises(RuntimeError, match="out of resources"):
        tuner((128, 128, torch.bfloat16, False, False), launch, CPU)
    assert _launch._siblings == ()
"""tools/gdn_rule_registers.py: the decode rule compiled for sm_90 as a launch would compile it, and ptxas's
register report, without a GPU (Triton ships the ptxas it compiles with)."""

import importlib.util
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "gdn_rule_registers.py"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("gdn_rule_registers", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_register_cap_and_the_one_token_body_reach_the_compile(tool):
    from torch_aura.triton_kernels.gdn import recurrent

    before = (recurrent._tile, recurrent.ONE_TOKEN, recurrent.MAX_REGISTERS)
    free = tool.measure("vllm", 64, "32x1")
    capped = tool.measure("vllm", 64, "32x1:one:r168")
    assert (recurrent._tile, recurrent.ONE_TOKEN, recurrent.MAX_REGISTERS) == before, "settings not restored"
    assert free["tile"] == capped["tile"] == "32x1" and not free["one_token"] and capped["one_token"]
    assert capped["registers"] <= 168 < free["registers"], (free, capped)
    assert capped["programs_per_sm"] > free["programs_per_sm"]
    # a program holds a 128 x 32 bf16 tile: 8 KB of state in flight per program
    assert capped["state_kb_in_flight_per_sm"] == 8 * capped["programs_per_sm"]


def test_transformers_layout_and_the_table(tool, capsys):
    assert tool.main(["--layout", "transformers", "--batch", "8", "--variants", "auto,auto:one"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| auto")]
    assert [row.split(" | ")[2] for row in rows] == ["False", "True"], rows  # the one-token column
    assert all(int(row.split(" | ")[3]) > 0 for row in rows)

"""Fixtures of the Metal emulator tests: the emulator library, built once per session."""

import os
import sys

import pytest

import _metal

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _compare.py (importlib import mode)


@pytest.fixture(scope="session")
def emu():
    return _metal.Emulator(_metal.build_emulator(_metal.clang_or_skip()))

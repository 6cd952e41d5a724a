"""Shared fixtures. CPU tests run everywhere; tests marked ``gpu`` skip
without CUDA (with the reason) and run with ``pytest python/tests -m gpu``."""

import pytest

import attnforge


@pytest.fixture(autouse=True)
def _default_policy():
    """Every test starts and ends with the default ranking."""
    attnforge.set_policy()
    yield
    attnforge.set_policy()

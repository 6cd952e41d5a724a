"""The interleaved bench's pure parts (scripts/interleave.py): the balanced
order of the modules in a round, and the report's ratios and carry-over table.
CPU only; the bench itself runs on the GPU machine."""
import importlib.util
import pathlib
from collections import Counter

import pytest

_PATH = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "interleave.py"


@pytest.fixture(scope="module")
def interleave():
    spec = importlib.util.spec_from_file_location("interleave", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7])
def test_every_module_follows_every_other_equally_often(interleave, n):
    rows = interleave.williams(n)
    assert len(rows) == (n if n % 2 == 0 else 2 * n)
    for row in rows:
        assert sorted(row) == list(range(n)), row
    pairs = Counter((a, b) for row in rows for a, b in zip(row, row[1:]))
    assert set(pairs) == {(a, b) for a in range(n) for b in range(n) if a != b}
    assert len(set(pairs.values())) <= 1, pairs
    # Every module opens a round equally often.
    assert len(set(Counter(row[0] for row in rows).values())) == 1


def test_the_report_gives_ratios_of_medians_and_what_ran_before(interleave):
    names = ["attnforge", "sm80 path", "torch-flash", "torch-cudnn"]
    square = interleave.williams(4)
    figures = {n: [] for n in names}
    after = {n: [] for n in names}
    base = {"attnforge": 600.0, "sm80 path": 330.0, "torch-flash": 300.0, "torch-cudnn": 500.0}
    prev = None
    for r in range(8):
        for i in square[r % 4]:
            n = names[i]
            # 2% slower right after the module at the power limit.
            figures[n].append(base[n] * (0.98 if prev == "attnforge" else 1.0))
            after[n].append(prev)
            prev = n
    import statistics

    row = {"d": 128, "s": 2048, "b": 8, "h": 16, "causal": False, "rounds": figures, "after": after,
           "median": {n: statistics.median(f) for n, f in figures.items()}}
    meta = {"date": "2026-12-06 12:00 UTC", "device": "test", "torch": "x", "cudnn": 0, "rounds": 8,
            "direction": "fwd"}
    text = interleave.report(meta, [row])
    assert text.startswith("Forward, bf16, test")
    line = next(x for x in text.splitlines() if x.startswith("| 128 | 2048 |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    # vs FA2, vs cuDNN (attnforge), sm80 path vs FA2: ratios of the medians.
    med = row["median"]
    want = [f"{med[a] / med[b]:.2f}x" for a, b in
            [("attnforge", "torch-flash"), ("attnforge", "torch-cudnn"), ("sm80 path", "torch-flash")]]
    assert cells[8:11] == want, cells
    assert want[0] == "2.00x"  # neither follows the slow module in most rounds
    carry = next(x for x in text.splitlines() if x.startswith("| sm80 path | 0.980"))
    assert "| - |" in carry
    meta["direction"] = "bwd"
    assert interleave.report(meta, [row]).startswith("Backward (dQ, dK, dV")

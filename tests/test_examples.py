"""The example suites a user copies must keep working: each runs in its own pytest process, as a user
would run it, and its outcome counts are pinned."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run(*args: str, cwd: Path) -> tuple[int, str, dict[str, int]]:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    last = out.strip().splitlines()[-1] if out.strip() else ""
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?)", last)}
    return proc.returncode, out, counts


@pytest.mark.parametrize(
    ("example", "dtypes", "expected"),
    [
        # CUDA rows are skipped here, named under "holes in the provider × dtype matrix"
        ("test_layer_norm_matmul_add.py", "float32,float16", {"passed": 2, "skipped": 2}),
        ("test_blame_layer_norm.py", "float32,float16", {"passed": 2, "skipped": 2}),
        ("test_fp16_hazards.py", "float32,float16", {"passed": 10, "xfailed": 5}),
        ("test_llama_attention.py", "float32,float16,bfloat16", {"passed": 8, "skipped": 4}),
        ("test_fuzz_layer_norm.py", "float32,float16", {"passed": 3}),
        ("test_fuzz_attention.py", "float32,float16", {"passed": 3}),
    ],
)
def test_example_suite_passes(example: str, dtypes: str, expected: dict[str, int], tmp_path: Path) -> None:
    rc, out, counts = _run(str(EXAMPLES / example), f"--ort-dtypes={dtypes}", "--hypothesis-profile=ortdiff-ci", cwd=tmp_path)
    assert rc == 0, out[-3000:]
    assert counts == expected, out[-3000:]
    assert "ortdiff summary" in out or "blame" in example, out[-3000:]


def test_baseline_example_fails_until_created_then_passes(tmp_path: Path) -> None:
    example = str(EXAMPLES / "test_baseline_and_reproducibility.py")
    common = (example, "--ort-dtypes=float32", f"--ortdiff-baseline-dir={tmp_path / 'baselines'}")
    rc, out, counts = _run(*common, cwd=tmp_path)
    assert rc == 1 and counts.get("failed") == 2, out[-3000:]
    assert "baseline(s) missing: rerun with --ortdiff-update-baselines to create them" in out
    rc, out, _ = _run(*common, "--ortdiff-update-baselines", cwd=tmp_path)
    assert rc == 0, out[-3000:]
    assert "review and commit them" in out
    rc, out, counts = _run(*common, cwd=tmp_path)
    assert rc == 0 and counts.get("failed", 0) == 0 and counts["passed"] >= 3, out[-3000:]

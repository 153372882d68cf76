"""The example suites a user copies must keep working: they run in their own pytest processes, as a user
would run them, and each file's outcome counts are pinned."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


#: $ORTDIFF_EXAMPLES_THREADS="1,2,16" (CI): the example suites run once per thread count, onnxruntime's and
#: torch's both fixed to it ($ORTDIFF_THREADS): their verdicts must not depend on the machine's cores
THREADS = [t.strip() for t in os.environ.get("ORTDIFF_EXAMPLES_THREADS", "").split(",") if t.strip()] or [""]


def _run(*args: str, cwd: Path, threads: str = "") -> tuple[int, str, dict[str, int]]:
    env = {**os.environ, "ORTDIFF_THREADS": threads} if threads else None
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    out = proc.stdout + proc.stderr
    last = out.strip().splitlines()[-1] if out.strip() else ""
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?)", last)}
    return proc.returncode, out, counts


@pytest.mark.parametrize(
    ("dtypes", "expected"),
    [
        (
            "float32,float16",
            {
                # CUDA rows are skipped here, named under "holes in the provider × dtype matrix"
                "test_layer_norm_matmul_add.py": {"passed": 2, "skipped": 3},
                "test_blame_layer_norm.py": {"passed": 2, "skipped": 2},
                "test_fp16_hazards.py": {"passed": 10, "xfailed": 5},
                "test_fuzz_layer_norm.py": {"passed": 3},
                "test_fuzz_attention.py": {"passed": 3},
            },
        ),
        ("float32,float16,bfloat16", {"test_llama_attention.py": {"passed": 8, "skipped": 4}}),
    ],
    ids=["float32-float16", "with-bfloat16"],
)
@pytest.mark.parametrize("threads", THREADS, ids=[f"threads-{t}" if t else "threads-default" for t in THREADS])
def test_example_suites_pass(dtypes: str, expected: dict[str, dict[str, int]], threads: str, tmp_path: Path) -> None:
    """The suites that run with the same dtypes run in one pytest process (one start-up, not one per
    file); the --ortdiff-json file's test outcomes give each file's counts."""
    files = [str(EXAMPLES / name) for name in expected]
    rc, out, _ = _run(*files, f"--ort-dtypes={dtypes}", "--hypothesis-profile=ortdiff-ci", "--ortdiff-json=job.json", cwd=tmp_path, threads=threads)
    assert rc == 0, out[-3000:]
    counts: dict[str, Counter[str]] = {name: Counter() for name in expected}
    for t in json.loads((tmp_path / "job.json").read_text())["tests"]:
        counts[Path(t["test"].split("::")[0]).name][t["outcome"]] += 1
    assert {name: dict(c) for name, c in counts.items()} == expected, out[-3000:]
    assert "ortdiff summary" in out, out[-3000:]


@pytest.mark.parametrize("threads", THREADS, ids=[f"threads-{t}" if t else "threads-default" for t in THREADS])
def test_baseline_example_fails_until_created_then_passes(threads: str, tmp_path: Path) -> None:
    example = str(EXAMPLES / "test_baseline_and_reproducibility.py")
    common = (example, "--ort-dtypes=float32", f"--ortdiff-baseline-dir={tmp_path / 'baselines'}")
    rc, out, counts = _run(*common, cwd=tmp_path, threads=threads)
    assert rc == 1 and counts.get("failed") == 2, out[-3000:]
    assert "baseline(s) missing: rerun with --ortdiff-update-baselines to create them" in out
    rc, out, _ = _run(*common, "--ortdiff-update-baselines", cwd=tmp_path, threads=threads)
    assert rc == 0, out[-3000:]
    assert "review and commit them" in out
    rc, out, counts = _run(*common, cwd=tmp_path, threads=threads)
    assert rc == 0 and counts.get("failed", 0) == 0 and counts["passed"] >= 3, out[-3000:]

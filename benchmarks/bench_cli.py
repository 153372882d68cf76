"""How fast does the command line answer `--help` and a bad argument? As a ratio to `python -c pass`.

Issue 30: a missing file took 14.5 s to be reported (torch imported before the arguments were read). The
commands now check what they can before torch, onnxruntime and onnx are imported, so these answer in the
time of the interpreter and argparse. Each command runs in a fresh interpreter, alternating with
`python -c pass`; the best of each is compared, in wall time.

    python benchmarks/bench_cli.py [--repeat 7]

Ratios, not seconds, are what to compare between machines; no test asserts on them (tests/test_cli_commands.py
checks that none of these imports a heavy module).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _best(argv: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=False)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        missing = str(Path(tmp) / "missing.onnx")
        cases = {
            "--help": ["--help"],
            "compare --help": ["compare", "--help"],
            "compare MISSING.onnx": ["compare", missing],
            "blame MISSING.onnx": ["blame", missing],
            "compare M --dim a": ["compare", missing.replace("missing", "x"), "--dim", "a"],
        }
        base = _best([sys.executable, "-c", "pass"], args.repeat)
        print(f"python -c pass: {base * 1000:.0f} ms (best of {args.repeat})")
        for label, argv in cases.items():
            t = _best([sys.executable, "-m", "pytest_ortdiff", *argv], args.repeat)
            print(f"python -m pytest_ortdiff {label:<22} {t * 1000:6.0f} ms  {t / base:5.1f}x python -c pass")


if __name__ == "__main__":
    main()

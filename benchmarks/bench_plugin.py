"""What does the plugin's reporting cost a run? 500 parametrized tiny checks, with and without it.

A generated test file holds one tiny graph (MatMul then Add, 8x8, float32) and 500 parametrized tests,
each running `ortdiff.check` on it (onnxruntime's session and the torch evaluator are cached after the
first, so the checks themselves are cheap and the reporting's share is as large as it gets). The same
suite runs in a pytest subprocess:

- plain: the plugin as every run has it (the fixture's rows, the terminal summary table);
- reporting: plus `--ortdiff-json` and `--ortdiff-html` (every row and test outcome collected, the JSON
  file and the HTML report written at the end).

Runs alternate (plain, reporting, plain, ...) so that a busy machine slows both alike; the best of each
is compared, in wall time and in CPU time (user + system: the steadier one on a shared machine). Also timed in this process, alone: writing the JSON file and the HTML report of that run (the
reporting's own work at the end, free of the subprocesses' noise), and the HTML's size.

Goal (issue 14): reporting adds under 10 % to the run.

    python benchmarks/bench_plugin.py [--checks 500] [--repeat 3]

Ratios, not seconds, are what to compare between machines; no test asserts on them.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUITE = """
import numpy as np
import onnx
import onnx.helper as oh
import pytest
import torch

def _model(dtype=onnx.TensorProto.FLOAT):
    x = oh.make_tensor_value_info("x", dtype, [8, 8])
    w = oh.make_tensor_value_info("w", dtype, [8, 8])
    b = oh.make_tensor_value_info("b", dtype, [8])
    y = oh.make_tensor_value_info("y", dtype, [8, 8])
    nodes = [oh.make_node("MatMul", ["x", "w"], ["mw"]), oh.make_node("Add", ["mw", "b"], ["y"])]
    graph = oh.make_graph(nodes, "tiny", [x, w, b], [y])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=9)

MODEL = _model().SerializeToString()
_g = torch.Generator().manual_seed(0)
FEEDS = {"x": torch.randn(8, 8, generator=_g), "w": torch.randn(8, 8, generator=_g), "b": torch.randn(8, generator=_g)}

@pytest.mark.parametrize("i", range({checks}))
def test_tiny(ortdiff, i):
    ortdiff.check(MODEL, FEEDS)
"""


def run(suite: Path, extra: list[str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one pytest subprocess over `suite` (interpreter start
    and collection included). CPU time is the steadier figure on a shared machine: other processes make a
    run wait, not work."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:xdist",
        str(suite),
        *extra,
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=suite.parent, check=False)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(
            f"pytest failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checks", type=int, default=500)
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of each configuration (the best is kept)"
    )
    opts = parser.parse_args()

    from pytest_ortdiff.numerics.results import ResultsFile
    from pytest_ortdiff.reports.htmlreport import write_html

    with tempfile.TemporaryDirectory(prefix="bench_plugin_") as tmp:
        root = Path(tmp)
        suite = root / "test_tiny_checks.py"
        suite.write_text(SUITE.replace("{checks}", str(opts.checks)))
        json_path, html_path = root / "out.json", root / "out.html"
        reporting = [f"--ortdiff-json={json_path}", f"--ortdiff-html={html_path}"]
        run(suite, [])  # warm the file system cache and Python's bytecode cache, not timed
        plain: list[tuple[float, float]] = []
        with_reports: list[tuple[float, float]] = []
        for _ in range(opts.repeat):
            plain.append(run(suite, []))
            with_reports.append(run(suite, reporting))
        data = ResultsFile.read(json_path)
        size = html_path.stat().st_size
        # the reporting's own work at the run's end, timed alone (the subprocess figures carry the noise of
        # a shared machine): the JSON file written, the HTML rendered and written
        start = time.perf_counter()
        data.write(root / "again.json")
        json_s = time.perf_counter() - start
        start = time.perf_counter()
        write_html(root / "again.html", [data])
        html_s = time.perf_counter() - start

    print(f"{opts.checks} tiny checks, best of {opts.repeat} pytest subprocesses each")
    for what, i in (("wall", 0), ("CPU", 1)):
        a, b = min(t[i] for t in plain), min(t[i] for t in with_reports)
        print(
            f"  {what} time: plain (terminal summary only) {a:6.2f} s, with --ortdiff-json + --ortdiff-html {b:6.2f} s: reporting adds {100 * (b / a - 1):+.1f} %"
        )
        print(
            f"    all runs: plain {', '.join(f'{t[i]:.2f}' for t in plain)}; reporting {', '.join(f'{t[i]:.2f}' for t in with_reports)}"
        )
    print("  goal: reporting adds under 10 %")
    best_plain = min(t[0] for t in plain)
    own = json_s + html_s
    print(f"  HTML: {size / 1e6:.2f} MB for {len(data.results):,} checks")
    print(
        f"  timed alone in this process: JSON written in {json_s * 1e3:.0f} ms, HTML rendered and written in "
        f"{html_s * 1e3:.0f} ms: {100 * own / best_plain:.1f} % of the plain run"
    )


if __name__ == "__main__":
    main()

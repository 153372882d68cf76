"""The README and the documentation site stay true without building anything: the README stays short and
its links resolve, its code is the documentation's (whose blocks CI runs: docs/conftest.py), its test
command is the one CI runs, and every flag the pages' shell blocks pass to the command line or to pytest
exists. (`mkdocs build --strict` and the blocks themselves run in .ci/run, with the `docs` extra.)"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
#: the pages of the site (docs/_incoming/ holds notes not yet merged: not part of it)
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_incoming" not in p.relative_to(DOCS).parts)


def fences(text: str) -> Iterator[tuple[str, str]]:
    """(info string, body) of every fenced code block, nested ones (in list items) included."""
    for m in re.finditer(r"^( *)```([^\n`]*)\n(.*?)^\1```[ \t]*$", text, flags=re.M | re.S):
        indent = len(m.group(1))
        body = "\n".join(line[indent:] for line in m.group(3).splitlines())
        yield m.group(2).strip(), body


def language(info: str) -> str:
    """`python` of `python`, `{.python title="x"}`."""
    m = re.match(r"\{\s*\.([\w-]+)", info)
    return m.group(1) if m else (info.split() or [""])[0]


def slug(heading: str) -> str:
    """The anchor Python-Markdown's toc extension gives a heading (its default slugify)."""
    text = re.sub(r"`|\*\*|\[|\]\([^)]*\)", "", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+?)\s*$", text, flags=re.M)}


def test_the_readme_stays_short() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 250


def test_the_readme_links_resolve() -> None:
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        target, _, anchor = link.partition("#")
        path = (README.parent / target).resolve()
        assert path.exists(), f"README links to {link}: no such file"
        if anchor:
            assert anchor in anchors(path), f"README links to {link}: {target} has no heading #{anchor}"


def test_the_readme_code_is_the_documentations() -> None:
    """Each python block of the README is a block of a page (or the whole of one), where it runs."""
    pages = [language_and_body for page in PAGES for language_and_body in fences(page.read_text(encoding="utf-8"))]
    docs_python = [body for info, body in pages if language(info) == "python"]
    for info, body in fences(README.read_text(encoding="utf-8")):
        if language(info) == "python":
            assert any(body.strip() == d.strip() or body.strip() in d for d in docs_python), f"README block not in the docs:\n{body}"


def test_the_readme_test_command_is_the_one_ci_runs() -> None:
    """.ci/run installs the extras of the README's test command into a fresh venv and runs its pytest line."""
    commands = [body for info, body in fences(README.read_text(encoding="utf-8")) if language(info) == "bash"]
    test_command = commands[1]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    install = re.search(r'pip install (-e "\.\[[^\]]+\]")', test_command)
    assert install and install.group(1) in ci, test_command
    run = test_command.rsplit("&&", 1)[1].strip()
    # (CI may set environment variables for it: ORTDIFF_EXAMPLES_THREADS runs the examples at several thread counts)
    assert run == "python -m pytest -n 2 -q" and re.search(rf"^(?:[A-Z_]+=\S+ )*{re.escape(run)}$", ci, flags=re.M)
    assert "pip install torch==2.13.0" in test_command and "torch==2.13.0" in ci


def shell_commands() -> Iterator[tuple[str, list[str]]]:
    """(where, argv) of every command in a shell block of the README and the pages."""
    for page in [README, *PAGES]:
        for info, body in fences(page.read_text(encoding="utf-8")):
            if language(info) not in ("bash", "console", "shell", "sh"):
                continue
            lines = [line for line in body.splitlines() if language(info) != "console" or line.startswith("$ ")]
            script = re.sub(r"\\\n\s*", " ", "\n".join(line.removeprefix("$ ") for line in lines))
            for line in script.splitlines():
                for command in re.split(r"&&|;", line.split(" #", 1)[0]):
                    if command.strip():
                        yield f"{page.relative_to(ROOT)}: {command.strip()}", shlex.split(command)


def ortdiff_flags() -> list[tuple[str, str, str]]:
    """(where, the command line's subcommand or "pytest", flag) of every flag of ours a shell block passes."""
    out = []
    for where, argv in shell_commands():
        words = [w for w in argv if w not in ("python", "python3")]
        if words[:2] == ["-m", "pytest_ortdiff"] or words[:1] == ["pytest-ortdiff"]:
            rest = words[2:] if words[0] == "-m" else words[1:]
            sub, args = rest[0], rest[1:]
            if sub == "demo":  # everything after `demo` is pytest's
                out += [(where, "pytest", a.split("=")[0]) for a in args if a.startswith("--ort")]
            else:
                out += [(where, sub, a.split("=")[0]) for a in args if a.startswith("--")]
        elif words[:1] == ["pytest"] or words[:2] == ["-m", "pytest"]:
            out += [(where, "pytest", a.split("=")[0]) for a in words if a.startswith("--ort")]
    return out


def test_the_shell_blocks_use_flags_that_exist(tmp_path: Path, cli: Callable[..., Any]) -> None:
    found = ortdiff_flags()
    subcommands = {sub for _, sub, _ in found} - {"pytest"}
    assert {"compare", "merge", "precision", "conformance"} <= subcommands
    helps = {sub: cli(sub, "--help").stdout for sub in subcommands}
    # from a directory without conftests: the plugin's options alone (it loads as an entry point)
    helps["pytest"] = subprocess.run(
        [sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"], capture_output=True, text=True, cwd=tmp_path, check=True
    ).stdout
    unknown = [f"{where}: {flag}" for where, sub, flag in found if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", helps[sub])]
    assert not unknown, "\n".join(unknown)


@pytest.mark.parametrize(
    ("text", "flags"),
    [
        ("```bash\npython -m pytest_ortdiff compare m.onnx --dim a=2 --nope \\\n    --seed 1\n```", [("compare", "--dim"), ("compare", "--nope"), ("compare", "--seed")]),
        ("```console\n$ pytest x.py --ortdiff-json=j.json -q\nsome output --not-a-flag\n```", [("pytest", "--ortdiff-json")]),
    ],
)
def test_the_flags_of_a_shell_block_are_found(text: str, flags: list[tuple[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = tmp_path / "page.md"
    page.write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "README", page)
    monkeypatch.setattr(sys.modules[__name__], "PAGES", [])
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert [(sub, flag) for _, sub, flag in ortdiff_flags()] == flags


@pytest.mark.parametrize("threads", ["1", "2", "16"])
def test_the_readme_demo_runs_green_on_any_thread_count(threads: str) -> None:
    """The README's first command, its pytest part as written (in a fresh interpreter, from the checkout's
    root): the CPU cases pass and print their reports, whatever onnxruntime's and torch's thread counts
    (the demo went red on a 16-core machine when its budget was one machine's); the CUDA cases, where CUDA
    is absent, are skipped and named."""
    import os

    demo = next(body for info, body in fences(README.read_text(encoding="utf-8")) if language(info) == "bash")
    argv = shlex.split(demo.rsplit("&&", 1)[1].strip())
    assert argv[:3] == ["python", "-m", "pytest"] and "--ortdiff-reports" in argv, argv
    proc = subprocess.run(
        [sys.executable, *argv[1:], "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "ORTDIFF_THREADS": threads},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "[CPU-float32] (passed" in out and "[CPU-float16] (passed" in out, out[-3000:]
    from pytest_ortdiff.runtimes.providers import available

    last = out.strip().splitlines()[-1]
    assert re.search(rf"\b{2 * len(available())} passed\b", last) and "failed" not in last, last

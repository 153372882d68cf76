"""The optional C extension `pytest_ortdiff._fastdiff` (the fused CPU pass of `compare`).

Everything else is configured in pyproject.toml. The extension is optional: without a C compiler the
build goes on without it and `compare` takes its numpy path (same numbers, slower).
"""

import sys

from setuptools import Extension, setup

if sys.platform == "win32":
    args = ["/O2", "/fp:precise"]
else:
    # no contraction: atol + rtol*|e| must round twice, as numpy does
    # (-Wno-psabi: the AVX-512 clones pass 64-byte vectors between inlined helpers only)
    args = ["-O3", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-Wno-psabi"]

setup(
    ext_modules=[
        Extension(
            "pytest_ortdiff._fastdiff",
            sources=["pytest_ortdiff/_fastdiff.c"],
            extra_compile_args=args,
            optional=True,
        )
    ]
)

"""Analyses built on the Checker: shape fuzzing and its strategies, half-precision audits, graph alignment,
export parity and the torch.compile backend. Their public paths stay `pytest_ortdiff.precision`, `.align`, ..."""

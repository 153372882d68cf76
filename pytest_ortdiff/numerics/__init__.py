"""What a comparison is: dtypes, values between numpy and torch, the histogram diff, tolerances, typed result
rows and their rendering. The lowest layer: it imports no runtime (tests/test_architecture.py holds it)."""

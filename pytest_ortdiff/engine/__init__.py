"""What the Checker composes: a check (runtimes, diff, tolerance), blame, stored baselines and reproducibility.
No pytest: the plugin, the command line and users without pytest run it."""

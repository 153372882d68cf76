"""Root conftest: the project's own tests drive real pytest runs through pytester."""

pytest_plugins = ["pytester"]

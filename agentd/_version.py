"""The version, written once: pyproject.toml reads it (``[tool.setuptools.dynamic]``) and so does the CLI."""

__version__ = "0.1.0"

"""kiln's version: one definition, read by the package, the CLI and the executable files."""

__version__ = "0.1.0"

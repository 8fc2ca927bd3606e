"""The installed package version, read once from the distribution metadata."""

from importlib import metadata

try:
    __version__ = metadata.version("agentd-trio")
except metadata.PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

"""rankwatch: per-rank observability for distributed GPU training."""

# Kept in sync with pyproject.toml (project.version and the RANKWATCH_VERSION
# CMake define); tests/test_packaging.py checks that they agree.
__version__ = "0.1.0"

"""Analysis of scalestudy result files (schema: docs/results-schema.md)."""

__version__ = "0.1.0"

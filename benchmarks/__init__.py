"""Benchmarks for response_compaction: ``python -m benchmarks`` (``nox -s bench``)."""

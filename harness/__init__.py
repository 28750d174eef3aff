"""What only tests, benchmarks and ``rankscope demo`` use: synthetic jobs, public-data loaders, the fault job.

The library never imports this package (an import-linter contract says so); ``rankscope.cli.demo`` and
``rankscope.harness.faultjob`` (``python -m rankscope.harness.faultjob``) are its entry points.
"""

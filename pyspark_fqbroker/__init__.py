"""Lets Spark find the ``fq`` format with no ``register`` call.

At the first data-source call, Spark imports every top-level module named ``pyspark_*`` on
its Python path and registers the ``DefaultSource`` each defines under its ``name()``.
"""

from fqbroker.spark import FqDataSource as DefaultSource

__all__ = ["DefaultSource"]

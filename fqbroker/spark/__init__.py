"""PySpark data source ``fq``: read fq disk queues and retained topics, publish to exchanges.

Needs the ``spark`` extra (pyspark and pyarrow); the broker never imports this package.
Spark finds it through the ``pyspark_fqbroker`` shim installed alongside; where it
cannot, :func:`register` registers it with a session (and does nothing where Spark has
it, so that Spark does not warn that it replaced it). Options, schema and
guarantees are in the README's Spark section; the HTTP reads the source makes are in
docs/http.md. Modules: ``options``, ``schema``, ``source``, ``sink``, ``datasource``; the
broker calls go through :mod:`fqbroker.clients.http.replay` and :mod:`~fqbroker.clients.fq.client`.
"""

from __future__ import annotations

from .datasource import FqDataSource, register
from .source import DataLossError

__all__ = ["DataLossError", "FqDataSource", "register"]

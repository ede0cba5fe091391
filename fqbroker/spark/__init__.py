"""PySpark data source ``fq``: read fq disk queues and publish to fq exchanges.

Needs the ``spark`` extra (``pip install -e '.[spark]'`` in a clone: pyspark and pyarrow). The
broker never imports this package. Register it per session, or let Spark find it through
the ``pyspark_fqbroker`` shim installed alongside::

    spark.dataSource.register(FqDataSource)
    spark.readStream.format("fq").option("queue", "events").option("exchange", "logs").load()
    df.write.format("fq").option("exchange", "logs").mode("append").save()

Options, schema and guarantees are in the README's Spark section; the HTTP reads the
source makes are in docs/http.md.

Modules: ``options`` (parsing), ``schema`` (rows), ``source`` (stream and batch readers),
``sink`` (writers), ``datasource`` (the format); the broker calls go through
:mod:`fqbroker.clients.replayclient` and :mod:`fqbroker.clients.client`.
"""

from __future__ import annotations

from .datasource import FqDataSource
from .source import DataLossError

__all__ = ["DataLossError", "FqDataSource"]

"""``FqDataSource``: the ``fq`` format, tying options to the source and sink classes.

Options are checked at the first call Spark makes where they can be: the names (and the
broker's address) when the data source is made, at ``load()``, ``save()`` or
``start()``; what only a read takes, and whether its queue or topic exists, in
``schema()``, still at ``load()``; the rest when Spark asks for the reader or writer.
Every error goes through :func:`~.options.first_line`, so that its message is the first
line Spark shows.
"""

from __future__ import annotations

from typing import Any, NoReturn

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from fqbroker.errors import SparkOptionError

from .options import (
    ANY,
    BrokerOptions,
    SinkOptions,
    SourceOptions,
    check_exists,
    check_names,
    first_line,
)
from .schema import SCHEMA
from .sink import FqStreamWriter, FqWriter
from .source import FqBatchReader, FqStreamReader

__all__ = ["FqDataSource", "register"]


def _columns(schema: StructType) -> dict[str, str]:
    return {field.name: field.dataType.typeName() for field in schema.fields}


class FqDataSource(DataSource):
    """Read fq disk queues and publish to fq exchanges from Spark (format ``"fq"``)."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        with first_line():
            check_names(options, ANY)
            BrokerOptions.parse(options)

    @classmethod
    def name(cls) -> str:
        return "fq"

    def schema(self) -> StructType:
        # Only reads ask for it (unless given a schema), at load().
        with first_line():
            check_exists(SourceOptions.parse(self.options, streaming=None))
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        with first_line():
            options = SourceOptions.parse(self.options, streaming=False)
            check_exists(options)
        return FqBatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        try:
            options = SourceOptions.parse(self.options, streaming=True)
        except SparkOptionError as exc:
            return _Refused(exc)
        return FqStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        with first_line():
            if overwrite:
                # Published messages cannot be taken back.
                raise SparkOptionError('fq sink: only mode("append") is supported')
            return FqWriter(SinkOptions.parse(self.options, _columns(schema)))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        # Every output mode just publishes what the micro-batch holds, as Kafka's sink does.
        with first_line():
            options = SinkOptions.parse(self.options, _columns(schema), streaming=True)
        return FqStreamWriter(options)


class _Refused(DataSourceStreamReader):
    """A stream whose options were refused, failing at Spark's first call.

    Spark's stream runner reports an error raised by ``streamReader()`` itself under an
    ``UnboundLocalError`` of its own; one raised by the first call it makes on the reader
    is reported as it is.
    """

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def _fail(self, *args: Any) -> NoReturn:
        with first_line():
            raise self.error

    initialOffset = latestOffset = partitions = read = commit = _fail
    getDefaultReadLimit = reportLatestOffset = _fail

    def stop(self) -> None:
        pass


def register(spark: Any) -> None:
    """Register the ``fq`` format with the SparkSession ``spark``, unless Spark already has it.

    Where fqbroker is installed, Spark finds the format by itself through the
    ``pyspark_fqbroker`` shim; ``spark.dataSource.register`` would replace that one, and
    Spark warns on every run that it did. Elsewhere (no shim on the driver's path, or a
    Python without fqbroker looking formats up) this registers it.
    """
    try:
        manager = spark._jsparkSession.sessionState().dataSourceManager()
        found = bool(manager.dataSourceExists(FqDataSource.name()))
    except Exception:  # Spark Connect (no JVM here), or the lookup itself failed
        found = False
    if not found:
        spark.dataSource.register(FqDataSource)

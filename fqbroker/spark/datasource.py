"""``FqDataSource``: the ``fq`` format, tying options to the source and sink classes."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from .options import SinkOptions, SourceOptions
from .schema import SCHEMA
from .sink import FqStreamWriter, FqWriter
from .source import FqBatchReader, FqStreamReader

__all__ = ["FqDataSource"]


def _columns(schema: StructType) -> dict[str, str]:
    return {field.name: field.dataType.typeName() for field in schema.fields}


class FqDataSource(DataSource):
    """Read fq disk queues and publish to fq exchanges from Spark (format ``"fq"``)."""

    @classmethod
    def name(cls) -> str:
        return "fq"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return FqBatchReader(SourceOptions.parse(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return FqStreamReader(SourceOptions.parse(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            # Published messages cannot be taken back.
            raise ValueError('fq sink: only mode("append") is supported')
        return FqWriter(SinkOptions.parse(self.options, _columns(schema)))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        # Every output mode just publishes what the micro-batch holds, as Kafka's sink does.
        return FqStreamWriter(SinkOptions.parse(self.options, _columns(schema)))

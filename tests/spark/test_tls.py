"""The Spark source's client and the sink over TLS, with ``cafile`` and the login options,
against a broker that requires TLS: no SparkSession needed for what TLS changes."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
import trustme

from fqbroker.settings.broker import Settings
from tests.conftest import TIMEOUT, running
from tests.pki import make_pki
from tests.prereqs import require_module

require_module("pyspark", "the spark extra is not installed (`make spark`)")
require_module("pyarrow", "the spark extra is not installed (`make spark`)")

import pyarrow as pa  # noqa: E402

from fqbroker.spark.options import BrokerOptions, SinkOptions  # noqa: E402
from fqbroker.spark.sink import publish  # noqa: E402

pytestmark = pytest.mark.spark


async def test_source_client_and_sink_over_tls(settings: Settings, tmp_path: Path) -> None:
    pki = make_pki(trustme.CA(), tmp_path)
    strict = replace(settings, tls_cert=pki["cert"], tls_key=pki["key"], tls_required=True)
    async with running(strict) as broker, asyncio.timeout(TIMEOUT):
        options = {"port": str(broker.port), "cafile": str(pki["ca"]), "user": "spark-tls"}
        source = BrokerOptions.parse(options)
        assert source.tls and source.user == "spark-tls"
        client = source.client()
        await asyncio.to_thread(client.ensure_queue, "sq", user=source.user, exchange="logs")
        sink = SinkOptions.parse(
            {**options, "exchange": "logs", "route": "r"}, {"payload": "binary"}
        )
        batch = pa.record_batch([pa.array([b"a", b"b"], pa.binary())], names=["payload"])
        assert await publish(sink, iter([batch])) == 2
        info = await asyncio.to_thread(client.info, "sq")
        entries = await asyncio.to_thread(client.read, "sq", info.first, info.next)
        assert [e.message.payload for e in entries] == [b"a", b"b"]
        # tls=true without a CA file trusts the system's CAs only: refused, said so.
        untrusted = BrokerOptions.parse({"port": str(broker.port), "tls": "true"}).client()
        with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
            await asyncio.to_thread(replace(untrusted, retry_seconds=0).info, "sq")

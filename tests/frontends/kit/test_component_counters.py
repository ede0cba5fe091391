"""A front end's counters are its own: the toy (tests/frontends/kit/toy.py), registered by
these tests alone, shows its counter and gauge in /stats.json, /metrics, /frontends.json and
the web UI, and serves connections, with no other module edited. The fuzzer's table is the
broker's."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from fqbroker.server.broker import Broker
from fqbroker.server.frontends import FRONT_ENDS
from fqbroker.settings.broker import Settings
from tests.conftest import TIMEOUT, running, wait_for
from tests.e2e.http.test_http import metrics, stats
from tests.e2e.webui.test_webui import Chromium, Page, require_chromium, until
from tests.frontends.kit.toy import TOY, toy_port, with_toy
from tests.server.test_frontends import front_ends_json


class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, broker: Broker) -> Conn:
        conn = cls(*await asyncio.open_connection("127.0.0.1", toy_port(broker)))
        async with asyncio.timeout(TIMEOUT):
            assert await conn.reader.readline() == b"hello\n"  # the greeting
        return conn

    async def echo(self, line: bytes) -> None:
        self.writer.write(line + b"\n")
        async with asyncio.timeout(TIMEOUT):
            assert await self.reader.readline() == line + b"\n"

    def close(self) -> None:
        self.writer.close()


# --- the toy everywhere -----------------------------------------------------------------------


async def test_a_toy_front_end_shows_its_counters_everywhere(settings: Settings) -> None:
    async with running(with_toy(settings), TOY) as broker:
        conn = await Conn.open(broker)
        try:
            await conn.echo(b"hello")
            await conn.echo(b"again")

            assert (await stats(broker))["toy"] == {"echoes": 2, "sessions": 1}

            samples = await metrics(broker)
            assert samples[("fq_toy_echoes_total", ())] == 2
            assert samples[("fq_toy_sessions", ())] == 1
            assert samples[("fq_frontend_connections", (("frontend", "toy"),))] == 1

            toy = (await front_ends_json(broker))["toy"]
            assert (toy["transport"], toy["summary"], toy["open"]) == (
                "tcp",
                "a line echo",
                1,
            )
            assert toy["metrics"] == [
                {
                    "name": "fq_toy_echoes",
                    "kind": "counter",
                    "help": "Lines the toy echoed.",
                    "series": [{"labels": {}, "value": 2}],
                },
                {
                    "name": "fq_toy_sessions",
                    "kind": "gauge",
                    "help": "Toy connections open.",
                    "series": [{"labels": {}, "value": 1}],
                },
            ]
            # The UI's JSON: a panel of one tile per metric, drawn by the page as it is.
            panel = toy["panel"]
            assert (panel["id"], panel["title"]) == ("toy", "toy")
            assert [
                (t["label"], t["value"]["field"], t["value"]["value"]) for t in panel["tiles"]
            ] == [
                ("echoes", "echoes", 2),
                ("sessions", "sessions", 1),
            ]
        finally:
            conn.close()
        await wait_for(lambda: broker.front_ends["toy"].counters.open == 0)
        assert (await stats(broker))["toy"] == {"echoes": 2, "sessions": 0}


async def test_without_the_toy_nothing_of_it_shows(broker: Broker) -> None:
    assert "toy" not in await stats(broker)
    assert not [name for name, _ in await metrics(broker) if name.startswith("fq_toy")]
    assert "toy" not in await front_ends_json(broker)


async def test_a_toy_that_is_off_has_no_key_no_families_and_a_hidden_panel(
    settings: Settings,
) -> None:
    async with running(settings, TOY) as broker:  # its table's listen is empty: off
        assert "toy" not in await stats(broker)
        assert not [name for name, _ in await metrics(broker) if name.startswith("fq_toy")]
        toy = (await front_ends_json(broker))["toy"]
        assert "metrics" not in toy
        assert toy["panel"] == {"id": "toy", "title": "toy", "hidden": True}


TOY_PANEL = """
(() => {
  const panel = document.getElementById("toy-panel");
  if (!panel || panel.hidden || panel.getBoundingClientRect().height === 0) return null;
  const tiles = [...panel.querySelectorAll(".tile")];
  return {
    title: panel.querySelector("h2").textContent.trim(),
    tiles: tiles.map(t => [t.querySelector(".label").textContent,
                           Number(t.querySelector(".value").dataset.value),
                           t.querySelector(".value").textContent]),
  };
})()
"""


async def test_the_web_ui_draws_the_toy_s_panel(settings: Settings, tmp_path: Path) -> None:
    chromium = require_chromium()
    async with running(with_toy(settings), TOY) as broker:
        conn = await Conn.open(broker)
        browser = await Chromium.launch(chromium, tmp_path / "profile", tmp_path / "chromium.log")
        try:
            async with asyncio.timeout(60):
                page = await Page.open(browser, f"http://127.0.0.1:{broker.port}/")
                await conn.echo(b"x")
                await page.wait_for(until(TOY_PANEL, "s.tiles[0][1] === 1"))
                for _ in range(1233):  # updated in place, formatted as the page formats
                    await conn.echo(b"x")
                shown = await page.wait_for(until(TOY_PANEL, "s.tiles[0][1] === 1234"))
                assert shown["title"] == "toy"
                assert shown["tiles"] == [["echoes", 1234, "1,234"], ["sessions", 1, "1"]]
                assert page.errors() == []
        finally:
            await browser.close()
            conn.close()


# --- the fuzzer's table -------------------------------------------------------------------------


def test_every_front_end_names_its_fuzz_entries_and_the_fuzzer_has_each() -> None:
    from bench.frontends import FRONT_ENDS as FUZZED
    from bench.frontends import entries

    assert all(spec.fuzz for spec in FRONT_ENDS)
    assert [fe.name for fe in FUZZED] == [name for spec in FRONT_ENDS for name in spec.fuzz]
    by_name = {fe.name: fe for fe in FUZZED}
    assert by_name["fyrehose"].transport == "udp" and by_name["figg"].transport == "tcp"
    with pytest.raises(KeyError):  # a name the fuzzer has no scenario for
        entries((*FRONT_ENDS, dataclasses.replace(TOY, fuzz=("toy",))))


def test_every_bench_scenario_names_the_front_end_it_measures() -> None:
    from bench.suite import SCENARIOS

    named = [name for spec in FRONT_ENDS for name in spec.bench]
    assert sorted(named) == sorted(SCENARIOS)  # each scenario once, and no other

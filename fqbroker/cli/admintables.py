"""``fq-admin``'s answers for people: aligned tables and short lines (``--json`` for scripts).

Every function takes the admin API's answer (docs/admin.md) as it came and prints it;
numbers are right-aligned, anything a terminal would misread (control characters) is
escaped, and a long payload is cut to a preview.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["print_answer", "table"]

PREVIEW = 60  # characters of a payload shown in a peek


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ",".join(_cell(v) for v in value) or "-"
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]], empty: str) -> str:
    """``rows`` as an aligned table of ``columns`` (key, header); ``empty`` when none.
    Columns of numbers are right-aligned, their header too."""
    if not rows:
        return empty
    cells = [[_cell(row.get(key)) for key, _ in columns] for row in rows]
    numeric = [
        all(_is_number(row.get(key)) or row.get(key) is None for row in rows) for key, _ in columns
    ]
    headers = [header for _, header in columns]
    widths = [max(len(h), *(len(line[i]) for line in cells)) for i, h in enumerate(headers)]
    out = []
    for line in [headers, *cells]:
        parts = [
            cell.rjust(width) if num else cell.ljust(width)
            for cell, width, num in zip(line, widths, numeric, strict=True)
        ]
        out.append("  ".join(parts).rstrip())
    return "\n".join(out)


def _status(answer: dict[str, Any]) -> str:
    node = answer["node"]
    lines = [
        f"fqbroker {node['version']} (fq {node['fq_version']}), node {node['node_id']}",
        f"up {_duration(node['uptime_seconds'])}, {_bytes(node['rss_bytes'])} resident",
        f"queue dir {node['queue_dir']}: {_bytes(node['queue_dir_bytes'])}",
        f"{node.get('queues', 0)} queues, {node.get('clients', 0)} fq clients",
        "",
        table(
            node["front_ends"],
            [
                ("name", "FRONT END"),
                ("transport", "TRANSPORT"),
                ("address", "ADDRESS"),
                ("open", "CONNECTIONS"),
            ],
            "no front ends",
        ),
    ]
    if node["peers"]:
        lines += ["", _peer_links(node["peers"])]
    return "\n".join(lines)


def _peer_links(peers: list[dict[str, Any]]) -> str:
    columns = [("host", "PEER"), ("port", "PORT"), ("source", "AS"), ("state", "STATE"),
               ("reconnects", "RECONNECTS")]  # fmt: skip
    return table(peers, columns, "no peers")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h {minutes}m"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s"


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _queues(answer: dict[str, Any]) -> str:
    rows = [
        {**q, "sharing": "public" if q["public"] else "private",
         "kept": "permanent" if q["permanent"] else "transient"}
        for q in answer["queues"]
    ]  # fmt: skip
    columns = [("name", "NAME"), ("type", "TYPE"), ("policy", "POLICY"), ("sharing", "SHARING"),
               ("kept", "KEPT"), ("backlog", "BACKLOG"), ("backlog_limit", "LIMIT"),
               ("clients", "CLIENTS"), ("dropped", "DROPPED")]  # fmt: skip
    return table(rows, columns, "no queues")


def _peek(answer: dict[str, Any]) -> str:
    rows = []
    for m in answer["messages"]:
        text = m.get("payload")
        preview = "(binary)" if text is None else text
        if len(preview) > PREVIEW:
            preview = preview[: PREVIEW - 3] + "..."
        rows.append({**m, "preview": preview, "msgid": m["msgid"][:16]})
    columns = [("exchange", "EXCHANGE"), ("route", "ROUTE"), ("sender", "SENDER"),
               ("size", "SIZE"), ("preview", "PAYLOAD")]  # fmt: skip
    head = f"{answer['queue']}: {answer['backlog']} waiting"
    return head + "\n" + table(rows, columns, "(nothing waiting)")


def _bindings(answer: dict[str, Any]) -> str:
    columns = [("exchange", "EXCHANGE"), ("program", "PROGRAM"), ("queue", "QUEUE"),
               ("permanent", "PERMANENT"), ("stored", "STORED"), ("id", "ID")]  # fmt: skip
    return table(answer["bindings"], columns, "no bindings")


def _checkpoints(answer: dict[str, Any]) -> str:
    rows = [
        {**c, "queue": q["queue"], "name": c["name"] + (" (broker)" if c["reader"] else "")}
        for q in answer["queues"]
        for c in q["checkpoints"]
    ]
    columns = [("queue", "QUEUE"), ("name", "CHECKPOINT"), ("position", "POSITION"),
               ("behind", "BEHIND")]  # fmt: skip
    return table(rows, columns, "no checkpoints")


def _peers(answer: dict[str, Any]) -> str:
    columns = [("host", "HOST"), ("port", "PORT"), ("source", "AS"), ("exchange", "EXCHANGE"),
               ("program", "PROGRAM"), ("permanent", "PERMANENT"), ("origin", "FROM"),
               ("state", "STATE")]  # fmt: skip
    return table(answer["peers"], columns, "no upstream rows")


def _users(answer: dict[str, Any]) -> str:
    rows = [
        {"name": u["name"], "admin": u["admin"],
         "rules": " ".join(f"{'allow' if r['allow'] else 'deny'}:{r['kind']}:{r['pattern']}"
                           for r in u["rules"])}
        for u in answer["users"]
    ]  # fmt: skip
    out = table(rows, [("name", "USER"), ("admin", "ADMIN"), ("rules", "RULES")], "no users")
    if answer.get("auth") == "none":
        out += '\n(auth = "none": the broker checks no passwords until auth = "password")'
    return out


def _topics(answer: dict[str, Any]) -> str:
    if not answer["configured"]:
        return "no topics: the Figg listener is not configured"
    columns = [("name", "TOPIC"), ("messages", "MESSAGES"), ("size_bytes", "BYTES"),
               ("first", "FIRST"), ("next", "NEXT"), ("subscribers", "SUBSCRIBERS")]  # fmt: skip
    return table(answer["topics"], columns, "no topics")


def _done(area: str, action: str | None, answer: dict[str, Any]) -> str:
    """One line saying what a change did."""
    match area, action:
        case "queue", "create":
            q = answer["queue"]
            kept = "permanent" if q["permanent"] else "transient"
            return f"created {kept} {q['type']} queue {q['name']}"
        case "queue", "delete":
            closed = answer["clients_closed"]
            return f"deleted queue {answer['deleted']}" + (
                f" ({closed} client(s) disconnected)" if closed else ""
            )
        case "queue", "purge":
            return f"purged {answer['purged']} message(s)"
        case "binding", "add":
            b = answer["binding"]
            stored = " (stored)" if b["stored"] else ""
            return f"bound {b['program']} on {b['exchange']} to {b['queue']}, id {b['id']}{stored}"
        case "binding", "remove":
            return f"removed binding {answer['removed']}"
        case "publish", _:
            return (
                f"published: routed to {answer['routed']} queue(s), dropped {answer['dropped']}"
                + (", no route" if answer["no_route"] else "")
                + (", no such exchange" if answer["no_exchange"] else "")
            )
        case "peer", "remove":
            return f"removed {answer['removed']} upstream row(s)"
        case "peer", "add":
            p = answer["peer"]
            return f"added upstream {p['host']}:{p['port']} exchange {p['exchange']}"
        case "user", "add":
            return f"{'added' if answer['created'] else 'changed the password of'} {answer['user']}"
        case "user", "remove":
            return f"removed user {answer['removed']}"
        case "user", _:
            r = answer["rule"]
            verb = "allowed" if r["allow"] else "denied"
            return f"{answer['user']}: {verb} {r['kind']} on {r['pattern']}"
    return str(answer.get("message") or "done")


READS: dict[str, Callable[[dict[str, Any]], str]] = {
    "status": _status,
    "queues": _queues,
    "bindings": _bindings,
    "checkpoints": _checkpoints,
    "peers": _peers,
    "users": _users,
    "topics": _topics,
}


def print_answer(area: str, action: str | None, answer: dict[str, Any]) -> None:
    if area in READS:
        print(READS[area](answer))
    elif (area, action) == ("queue", "peek"):
        print(_peek(answer))
    else:
        print(_done(area, action, answer))

"""An example fqbroker rule plugin, the Python counterpart of an fqd module (``-m NAME``).

fqd finds a routing function through its C symbol ``fqd_route_prog__<name>__<sig>``;
fqbroker asks the plugin to register its functions instead. Load this one with
``RuleRegistry.load_module("fqbroker_rules_example")``, or install this directory as a
package: its pyproject.toml declares the ``fqbroker.rules`` entry point, so the broker's
default registry picks it up at startup.

Programs can then say, for example::

    prefix:"http." route_endswith(".json")
    prefix: route_contains_any("error", "fatal", "panic")
"""

from __future__ import annotations

from fqbroker.core.message import Message
from fqbroker.core.program import RuleRegistry

__all__ = ["register", "route_contains_any", "route_endswith"]


def route_endswith(msg: Message, suffix: bytes) -> bool:
    """``route_endswith("s")``: the route ends with s."""
    return msg.route.endswith(suffix)


def route_contains_any(msg: Message, *needles: bytes | float) -> bool:
    """``route_contains_any("a", "b", ...)``: the route contains any of the strings.

    Registered as variadic ("VA"), so it is called for any argument list; numbers, which
    a route cannot contain, never match.
    """
    return any(isinstance(n, bytes) and n in msg.route for n in needles)


def register(registry: RuleRegistry) -> None:
    """Add this plugin's functions; the hook both load_module and entry points call."""
    registry.register("route_endswith", "s", route_endswith)
    registry.register("route_contains_any", "VA", route_contains_any)

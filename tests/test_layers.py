"""Layers run one way: every import of the package points down the stack below, never up
or sideways (docs/architecture.md draws it).

The edges are test_imports.py's: every ``import`` in a module counts, those under
``if TYPE_CHECKING:`` and inside functions too. An edge may go from a module to one of a
lower layer, or within one unit (a package of the same layer). Front ends are units of
their own: one never imports another, and none imports a client; clients import no front
end; the wire formats they share live in ``fqbroker.protocols``.
"""

from __future__ import annotations

from tests.test_imports import imports_of, package_modules

# Lowest first. A module belongs to the longest prefix that names it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("fqbroker.errors", "fqbroker.version", "fqbroker.accel"),
    ("fqbroker.settings",),
    ("fqbroker.core",),
    ("fqbroker.storage",),
    ("fqbroker.protocols",),
    ("fqbroker.frontends.kit", "fqbroker.frontends"),
    ("fqbroker.frontends.*", "fqbroker.clients"),
    ("fqbroker.peering",),
    ("fqbroker.server",),
    ("fqbroker.spark", "fqbroker.cli"),
    ("fqbroker.__main__", "fqbroker"),
)


def unit_of(module: str) -> tuple[int, str]:
    """(layer, unit): the unit is the package a module's layer entry names; each front end
    (``fqbroker.frontends.NAME``) is a unit of its own."""
    best: tuple[int, str] | None = None
    for rank, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if prefix.endswith(".*"):
                base = prefix[:-2]
                if module.startswith(base + ".") and not module.startswith(base + ".kit"):
                    name = base + "." + module[len(base) + 1 :].split(".")[0]
                    if best is None or len(name) > len(best[1]):
                        best = (rank, name)
            elif (module == prefix or module.startswith(prefix + ".")) and (
                best is None or len(prefix) > len(best[1])
            ):
                best = (rank, prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


def violations() -> list[str]:
    modules = package_modules()
    out = []
    for name, path in sorted(modules.items()):
        rank, unit = unit_of(name)
        is_package = path.name == "__init__.py"
        for edge in imports_of(path.read_text(), name, is_package, modules):
            trank, tunit = unit_of(edge.target)
            if trank < rank or tunit == unit:
                continue
            how = f" ({edge.how})" if edge.how else ""
            out.append(f"{name}:{edge.line} imports {edge.target}{how}: {unit} -> {tunit}")
    return out


def test_every_module_has_a_layer() -> None:
    for name in package_modules():
        unit_of(name)


def test_imports_run_one_way() -> None:
    found = violations()
    assert not found, "imports against the layers:\n" + "\n".join(found)


def test_the_rule_catches_an_upward_and_a_sideways_import() -> None:
    # The check itself: a core module importing storage, a front end importing another,
    # a client importing a front end, and a front end importing the server are refused.
    cases = [
        ("fqbroker.core.router", "fqbroker.storage.store"),
        ("fqbroker.frontends.figg.session", "fqbroker.frontends.fq.command"),
        ("fqbroker.clients.fq.client", "fqbroker.frontends.fq.command"),
        ("fqbroker.frontends.http.endpoints", "fqbroker.server.broker"),
        ("fqbroker.frontends.fq.data", "fqbroker.clients.fq.client"),
    ]
    for source, target in cases:
        (rank, unit), (trank, tunit) = unit_of(source), unit_of(target)
        assert not (trank < rank or tunit == unit), (source, target)
    assert unit_of("fqbroker.frontends.kit.limits")[0] < unit_of("fqbroker.frontends.fq.data")[0]

"""Lifecycle diagrams: Mermaid text always; PNG / SVG through Graphviz when present."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from hkv_core.errors import HkvError
from hkv_core.spec.oracle import OracleModel, machine_transitions
from hkv_core.spec.records import KindSpec, LifecycleSpec


def mermaid(spec: LifecycleSpec) -> str:
    """The whole lifecycle as one Mermaid `stateDiagram-v2` with a block per kind."""
    lines = ["stateDiagram-v2"]
    for kind in spec.kinds.values():
        lines.append(f"    state {kind.name} {{")
        lines.append(f"        [*] --> {kind.name}_{kind.initial}")
        for state in kind.states:
            lines.append(f"        {kind.name}_{state} : {state}")
        for t in kind.transitions:
            guard = f" [{', '.join(t.guards)}]" if t.guards else ""
            lines.append(f"        {kind.name}_{t.source} --> {kind.name}_{t.dest} : {t.event}{guard}")
        for state in sorted(kind.final):
            lines.append(f"        {kind.name}_{state} --> [*]")
        lines.append("    }")
    return "\n".join(lines) + "\n"


def graphviz_available() -> bool:
    """True when the `graphviz` Python package and the `dot` program are both present."""
    try:
        import graphviz  # noqa: F401
    except ImportError:
        return False
    return shutil.which("dot") is not None


def render_graphviz(kind: KindSpec, path: Path) -> Path:
    """Draw one kind with transitions' GraphMachine to `path` (.png or .svg)."""
    if not graphviz_available():
        raise HkvError("Graphviz is not installed (pip install graphviz; apt-get install graphviz)",
                       missing="graphviz")
    from transitions.extensions import GraphMachine

    model: Any = OracleModel()
    GraphMachine(model=model, states=list(kind.states), initial=kind.initial,
                 transitions=machine_transitions(kind), auto_transitions=False,
                 show_conditions=True, title=kind.name)
    model.get_graph().draw(str(path), prog="dot", format=path.suffix.lstrip("."))
    return path

"""The readable oracle: a `transitions.Machine` built from the same spec.

Used by tests (to prove the compiled table agrees with it) and by the diagram
command.  Never on a hot path: one Machine per kind, driving one model object.
"""

from __future__ import annotations

from typing import Any

from transitions import Machine, MachineError

from hkv_core.errors import IllegalTransition
from hkv_core.spec.guards import GUARDS, GuardView
from hkv_core.spec.records import KindSpec


class OracleModel:
    """The model object the oracle Machine moves; guards read `self.view`."""

    state: str

    def __init__(self, view: GuardView | None = None) -> None:
        self.view = view

    trigger: Any  # added by transitions.Machine


def _guard_method(name: str) -> Any:
    def check(self: OracleModel) -> bool:
        assert self.view is not None, f"guard {name} needs a view"
        return bool(GUARDS[name](self.view))

    check.__name__ = f"guard_{name}"
    return check


for _name in GUARDS:
    setattr(OracleModel, f"guard_{_name}", _guard_method(_name))


def machine_transitions(kind: KindSpec) -> list[dict[str, Any]]:
    """The spec's transitions in `transitions`' dict form."""
    return [
        {"trigger": t.event, "source": t.source, "dest": t.dest,
         "conditions": [f"guard_{g}" for g in t.guards]}
        for t in kind.transitions
    ]


def build_machine(kind: KindSpec, model: OracleModel, machine_cls: Any = Machine) -> Any:
    """Build the oracle Machine for one kind around `model`."""
    return machine_cls(model=model, states=list(kind.states), initial=kind.initial,
                       transitions=machine_transitions(kind), auto_transitions=False,
                       ignore_invalid_triggers=False)


def oracle_step(kind: KindSpec, model: OracleModel, event: str) -> str:
    """Fire `event` on the oracle; return the new state or raise IllegalTransition."""
    before = model.state
    try:
        moved = model.trigger(event)
    except (MachineError, AttributeError) as exc:
        raise IllegalTransition(kind=kind.name, state=before, event=event) from exc
    if not moved:
        edge = kind.transition(before, event)
        refused = next(g for g in (edge.guards if edge else ()) if not GUARDS[g](model.view))  # type: ignore[arg-type]
        raise IllegalTransition(kind=kind.name, state=before, event=event, guard=refused)
    return model.state

"""One exception hierarchy for every operating error hkv raises.

Every error carries structured fields (``err.fields``) as well as a readable
message, so engines can log, count and branch on them without parsing text.
Programmer errors are ``assert`` statements, not ``HkvError``s.
"""

from __future__ import annotations

from typing import Any


class HkvError(Exception):
    """Base class: ``fields`` holds the structured details named in the message."""

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields: dict[str, Any] = fields


class SpecError(HkvError):
    """A spec file (lifecycle, validation, preset) is malformed.

    ``file``, ``table`` and ``key`` locate the offending entry.
    """

    def __init__(self, message: str, *, file: str, table: str, key: str) -> None:
        super().__init__(f"{file} [{table}] {key}: {message}", file=file, table=table, key=key)
        self.file, self.table, self.key = file, table, key


class ConfigError(HkvError):
    """A model config (Hugging Face style dict or preset) is unusable."""

    def __init__(self, message: str, *, source: str, key: str) -> None:
        super().__init__(f"{source}: {key}: {message}", source=source, key=key)
        self.source, self.key = source, key


class IllegalTransition(HkvError):
    """The lifecycle spec has no transition for (kind, state, event), or a guard refused it."""

    def __init__(self, *, kind: str, state: str, event: str, guard: str | None = None) -> None:
        why = f"guard {guard!r} refused" if guard else "no such transition in the spec"
        super().__init__(
            f"illegal transition: kind={kind} state={state} event={event} ({why})",
            kind=kind,
            state=state,
            event=event,
            guard=guard,
        )
        self.kind, self.state, self.event, self.guard = kind, state, event, guard


class UnitError(HkvError):
    """A size or position given in the wrong unit or out of range (tokens, entries, pages)."""

    def __init__(self, message: str, *, name: str, value: int) -> None:
        super().__init__(f"{name}={value}: {message}", name=name, value=value)
        self.name, self.value = name, value


class InvalidTokens(HkvError):
    """A token array is not a 1-D integer array of token ids in ``[0, 2**31)``.

    ``reason`` says what is wrong; ``dtype`` and ``shape`` describe what was
    given (``None`` when it was not a NumPy array at all).
    """

    def __init__(self, reason: str, *, dtype: str | None, shape: tuple[int, ...] | None) -> None:
        super().__init__(f"invalid tokens (dtype={dtype}, shape={shape}): {reason}",
                         reason=reason, dtype=dtype, shape=shape)
        self.reason, self.dtype, self.shape = reason, dtype, shape

"""The `hkv` command line.  Every command takes --json; no input makes it print a Python traceback.

Errors are caught here, at the boundary, and printed as one line on stderr
(with --json: one JSON document `{"error": {"type", "message", "fields",
"exit_status"}}` on stdout): a bad option value or a typed `HkvError` (a
malformed file, an output path that cannot be written) exits 2; anything else
is a bug in hkv and exits 70 with one line naming it (`HKV_TRACEBACK=1` shows
the traceback).  hkv_cli/errors.py lists every exit status.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence

import click

from hkv_cli.check_cmd import check_command
from hkv_cli.demo_cmd import demo_command
from hkv_cli.errors import FAILED, INTERNAL, INTERRUPTED, OK, USAGE
from hkv_cli.inspect_cmd import inspect_command
from hkv_cli.output import print_error
from hkv_cli.replay_cmd import replay_command
from hkv_cli.spec_cmd import spec_group
from hkv_core.errors import HkvError

TRACEBACK_ENV = "HKV_TRACEBACK"


@click.group()
@click.version_option(package_name="hkv")
def cli() -> None:
    """hkv: KV-cache state manager for hybrid-attention LLMs.

    Exit statuses: 0 ok, 1 a check found a problem, 2 bad input (option,
    file or output path), 3 `hkv check` stopped at its state cap with no
    verdict, 70 a bug in hkv, 130 interrupted.
    Every command takes --json; with it, errors are JSON on stdout too.
    """


cli.add_command(demo_command)
cli.add_command(check_command)
cli.add_command(inspect_command)
cli.add_command(spec_group)
cli.add_command(replay_command)


def wants_json(args: Sequence[str]) -> bool:
    """Whether the command line asks for JSON (before a `--` that ends the options)."""
    options = args[:list(args).index("--")] if "--" in args else args
    return "--json" in options


def run(args: Sequence[str]) -> int:
    """Run the command line on `args`; return the exit status.  Never lets an exception escape."""
    as_json = wants_json(args)
    try:
        result = cli.main(args=list(args), prog_name="hkv", standalone_mode=False)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (OK if done.code is None else USAGE)
    except HkvError as err:
        print_error(type(err).__name__, err.message, err.fields, USAGE, as_json=as_json)
        return USAGE
    except click.ClickException as err:  # bad option values, unknown commands, missing arguments
        if as_json:
            param = getattr(err, "param", None)
            fields: dict[str, object] = {}
            if isinstance(param, click.Parameter):
                fields["param"] = param.opts[0] if param.opts else param.name
            if isinstance(err, click.NoSuchOption):
                fields["option"] = err.option_name
            print_error(type(err).__name__, err.format_message(), fields, err.exit_code, as_json=True)
        else:
            err.show()
        return err.exit_code
    except click.exceptions.Abort:
        print_error("Interrupted", "interrupted", {}, INTERRUPTED, as_json=as_json)
        return INTERRUPTED
    except BrokenPipeError:  # the reader of stdout went away (click handles it inside commands): stop quietly
        _silence_stdout()
        return FAILED
    except Exception as err:  # noqa: BLE001 - the boundary: a bug in hkv, reported in one line
        if os.environ.get(TRACEBACK_ENV):
            traceback.print_exc()
        hint = f"this is a bug in hkv; rerun with {TRACEBACK_ENV}=1 for the traceback"
        message = f"{err} ({hint})" if str(err) else hint
        print_error(f"internal error: {type(err).__name__}", message, {}, INTERNAL, as_json=as_json)
        return INTERNAL
    return result if isinstance(result, int) else OK


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush raises nothing more."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point: the exit status of `run`."""
    status = run(sys.argv[1:] if argv is None else argv)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
        status = FAILED
    raise SystemExit(status)


__all__ = ["cli", "main", "run", "wants_json"]


if __name__ == "__main__":
    main()

"""The `hkv` command line.  Every command takes --json; errors exit 2 with a typed message."""

from __future__ import annotations

import sys

import click

from hkv_cli.check_cmd import check_command
from hkv_cli.demo_cmd import demo_command
from hkv_cli.inspect_cmd import inspect_command
from hkv_cli.output import console, print_json
from hkv_cli.spec_cmd import spec_group
from hkv_core.errors import HkvError


@click.group()
@click.version_option(package_name="hkv")
def cli() -> None:
    """hkv: KV-cache state manager for hybrid-attention LLMs."""


cli.add_command(demo_command)
cli.add_command(check_command)
cli.add_command(inspect_command)
cli.add_command(spec_group)


def main() -> None:
    """Console-script entry point: HkvErrors become exit status 2 with their fields."""
    try:
        cli.main(standalone_mode=False)
    except HkvError as err:
        if "--json" in sys.argv:
            print_json({"error": type(err).__name__, "message": err.message, "fields": err.fields})
        else:
            console.print(f"[red]error[/red] ({type(err).__name__}): {err.message}", markup=True,
                          highlight=False)
        raise SystemExit(2) from None
    except click.ClickException as err:
        err.show()
        raise SystemExit(err.exit_code) from None
    except click.exceptions.Abort:
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()

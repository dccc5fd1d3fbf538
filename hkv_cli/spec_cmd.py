"""`hkv spec ...`: the lifecycle spec as pictures and summaries."""

from __future__ import annotations

from pathlib import Path

import click

from hkv_cli.errors import output_folder, writing
from hkv_cli.output import console, print_json
from hkv_core.spec import load_lifecycle
from hkv_core.spec.diagram import graphviz_available, mermaid, render_graphviz


@click.group("spec")
def spec_group() -> None:
    """The lifecycle spec (specs/lifecycle.toml)."""


@spec_group.command("diagram")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Directory to write lifecycle.mmd (and one PNG/SVG per kind when Graphviz is present).")
@click.option("--format", "fmt", type=click.Choice(["png", "svg"]), default="svg", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
def diagram_command(out_dir: str | None, fmt: str, as_json: bool) -> None:
    """Write the lifecycle diagram as Mermaid text (stdout without --out)."""
    spec = load_lifecycle()
    text = mermaid(spec)
    if out_dir is None:
        if as_json:
            print_json({"mermaid": text, "files": []})
        else:
            click.echo(text, nl=False)
        return
    directory = output_folder("--out", Path(out_dir))
    files = [directory / "lifecycle.mmd"]
    graphviz = graphviz_available()
    with writing("--out", directory):
        files[0].write_text(text)
        if graphviz:
            files += [render_graphviz(kind, directory / f"{kind.name}.{fmt}") for kind in spec.kinds.values()]
    if not graphviz:
        console.print("Graphviz not found: wrote Mermaid text only "
                      "(pip install graphviz; apt-get install graphviz)", markup=False, highlight=False)
    if as_json:
        print_json({"files": [str(f) for f in files], "graphviz": graphviz})
    else:
        for f in files:
            click.echo(str(f))

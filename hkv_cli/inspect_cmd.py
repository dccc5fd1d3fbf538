"""`hkv inspect`: the derived layout of a model config or preset."""

from __future__ import annotations

import click

from hkv_cli.output import print_json
from hkv_core.layout import format_report_text, inspect_report, load_layout, preset_names
from hkv_core.manager.config_bounds import MAX_REQUEST_TOKENS


@click.command("inspect")
@click.argument("config_or_preset")
@click.option("--tokens", "prefix_tokens", type=click.IntRange(0, MAX_REQUEST_TOKENS), default=None,
              help="Also show the state needed to resume at prefix length P (at most the longest request a "
                   "manager admits).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def inspect_command(config_or_preset: str, prefix_tokens: int | None, as_json: bool) -> None:
    """Layer groups, pools and bytes per token of CONFIG_OR_PRESET: a Hugging Face config.json
    (or its directory) of a supported model_type (docs/models.md), or a preset: deepseek_v4_flash,
    deepseek_v4_pro, deepseek_v3, llama_full, qwen_full, mistral_swa, swa_full, tiny_v4, tiny_csa."""
    report = inspect_report(load_layout(config_or_preset), prefix_tokens)
    if as_json:
        print_json(report)
    else:
        click.echo(format_report_text(report))


__all__ = ["inspect_command", "preset_names"]

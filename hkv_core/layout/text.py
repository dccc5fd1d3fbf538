"""Plain-text tables of an ``inspect_report`` dict (the CLI may render them with rich)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

COLUMN_GAP = "  "
IDS_SHOWN_MAX = 6  # layer id lists longer than this are written as a range


def format_report_text(report: Mapping[str, Any]) -> str:
    """Render the report as lines of aligned text tables."""
    mtp = f" (+{report['mtp_layers']} MTP)" if report["mtp_layers"] else ""
    lines = [
        f"model {report['model']} ({report['model_type']}, {report['family']} family,"
        f" from {report['source']})",
        f"main layers {report['main_layers']}{mtp}, window {report['window_tokens']} tokens,"
        f" block {report['block_tokens']} tokens, kv {report['kv_dtype']},"
        f" alignment {report['alignment_bytes']} bytes",
        "",
        "groups",
        *_table(["name", "kind", "ratio", "layers", "window", "indexer", "layer ids"],
                [_group_row(g) for g in report["groups"] + report["mtp_groups"]]),
        "",
        "pools (sizes per layer)",
        *_table(["name", "object kind", "dtype", "entry shape", "entry B", "entries/page",
                 "tokens/page", "page B", "abi id"],
                [_pool_row(p) for p in report["pools"] + report["mtp_pools"]]),
        "",
        "bytes per token (all main layers)",
        *_table(["object kind", "bytes/token"],
                [[kind, f"{value:g}"] for kind, value in report["bytes_per_token"].items()]),
        *_state_lines(report),
    ]
    if report.get("resume") is not None:
        lines += ["", *_resume_lines(report["resume"])]
    return "\n".join(lines)


def _state_lines(report: Mapping[str, Any]) -> list[str]:
    """The recurrent state of a hybrid's linear layers: what every resume point keeps whatever its length."""
    states = [g for g in report["groups"] if g.get("recurrent_state")]
    if not states:
        return []
    rows = [[g["name"], g["recurrent_state"]["mixer"], str(g["layers"]),
             "[" + ",".join(map(str, g["recurrent_state"]["conv_shape"])) + "] " + g["recurrent_state"]["conv_dtype"],
             "[" + ",".join(map(str, g["recurrent_state"]["ssm_shape"])) + "] " + g["recurrent_state"]["ssm_dtype"],
             str(g["recurrent_state"]["bytes_per_layer"])] for g in states]
    return ["", f"recurrent state per resume point: {report['recurrent_state_bytes']} bytes",
            *_table(["group", "mixer", "layers", "conv state", "ssm state", "bytes/layer"], rows)]


def _group_row(g: Mapping[str, Any]) -> list[str]:
    ix = g["indexer"]
    indexer = f"{ix['n_heads']}x{ix['head_dim']} top{ix['topk']}" if ix else "-"
    return [g["name"], g["kind"], str(g["compress_ratio"]), str(g["layers"]),
            str(g["window_tokens"]), indexer, layer_ids_text(g["layer_ids"])]


def _pool_row(p: Mapping[str, Any]) -> list[str]:
    shape = "[" + ",".join(str(n) for n in p["entry_shape"]) + "]"
    return [p["name"], p["object_kind"], p["dtype"], shape, str(p["entry_bytes"]),
            str(p["entries_per_page"]), str(p["tokens_per_page"]), str(p["page_bytes"]),
            p["abi_id"]]


def _resume_lines(resume: Mapping[str, Any]) -> list[str]:
    rows = [_resume_row(g) for g in resume["groups"] + resume["mtp_groups"]]
    head = (f"resume at P = {resume['prefix_tokens']} tokens: {resume['bytes']} bytes"
            f" (MTP layers, when speculating: {resume['mtp_bytes']} bytes)")
    table = _table(["group", "kind", "ratio", "layers", "entries", "indexer keys",
                    "tail rows (overlap+rem)", "window rows", "window tokens", "bytes/layer",
                    "bytes"], rows)
    return [head, *table, *(f"note: {note}" for note in resume["notes"])]


def _resume_row(g: Mapping[str, Any]) -> list[str]:
    tail = g["tail_rows"]
    pad = f", {tail['padding']} padding" if tail["padding"] else ""
    start, end = g["window_tokens"]
    return [g["name"], g["kind"], str(g["compress_ratio"]), str(g["layers"]),
            str(g["compressed_entries"]), str(g["indexer_keys"]),
            f"{tail['total']} ({tail['overlap']}+{tail['remainder']}{pad})",
            str(g["window_rows"]), f"[{start}, {end})", str(g["bytes_per_layer"]),
            str(g["bytes"])]


def layer_ids_text(ids: Sequence[int]) -> str:
    """``0,1,2`` for short lists; ``2..42 step 2`` for long arithmetic runs."""
    if len(ids) <= IDS_SHOWN_MAX:
        return ",".join(str(i) for i in ids)
    steps = {b - a for a, b in zip(ids, ids[1:], strict=False)}
    if len(steps) == 1:
        step = steps.pop()
        return f"{ids[0]}..{ids[-1]}" + (f" step {step}" if step != 1 else "")
    return ",".join(str(i) for i in ids[:IDS_SHOWN_MAX]) + f",... ({len(ids)} layers)"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns, a rule under the header."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]
    assert len(widths) == len(headers)

    def line(cells: Sequence[str]) -> str:
        return COLUMN_GAP.join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(row) for row in rows)]

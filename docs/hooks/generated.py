"""MkDocs hook: the parts of the site that are read from the code at build time, so they cannot drift.

A line of its own in a page,

    ::: draftsmith cli plan train        the reference of `draftsmith plan train`, from the typer app
    ::: draftsmith defaults dspark       a drafter variant's defaults, from TrainConfig and the loss

is replaced by the generated Markdown. An unknown command or variant fails the build (a page that
names a command the CLI no longer has is a broken page). tests/test_docs.py imports this module to
check that every command of the app has its directive on a page.
"""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Iterator
from typing import Any

DIRECTIVE = re.compile(r"^::: draftsmith (cli|defaults)\b(.*)$", re.MULTILINE)
PROG = "draftsmith"


# ---- the command tree ------------------------------------------------------------------------------


@functools.cache
def root_command():
    """The click command typer builds from draftsmith's app (typer vendors its own click, so this
    module relies on the command's attributes, never on `isinstance(..., click.Command)`)."""
    import typer.main

    from draftsmith.cli import app

    return typer.main.get_command(app)


def walk(command=None, path: tuple[str, ...] = (), parent_context=None) -> Iterator[tuple[tuple[str, ...], Any, Any]]:
    """Every command below the root, depth first in `--help` order: (path, command, its context)."""
    command = command if command is not None else root_command()
    context = command.context_class(command, info_name=path[-1] if path else PROG, parent=parent_context)
    if path:
        yield path, command, context
    for name in getattr(command, "list_commands", lambda _context: [])(context):
        child = command.get_command(context, name)
        if child is not None and not getattr(child, "hidden", False):
            yield from walk(child, (*path, name), context)


def command_paths() -> list[tuple[str, ...]]:
    return [path for path, _command, _context in walk()]


def find(path: tuple[str, ...]):
    for found, command, context in walk():
        if found == path:
            return command, context
    raise KeyError(f"`{PROG} {' '.join(path)}` is not a command of the app; commands: "
                   + ", ".join(" ".join(p) for p in command_paths()))


# ---- rendering ---------------------------------------------------------------------------------------


def _literal(text: str) -> str:
    """Text shown as it is, even inside a Markdown table: HTML-escaped, and the characters Markdown
    reads (emphasis, a column break, a code span) written as entities."""
    text = html.escape(" ".join(str(text).split()), quote=False)
    for char in "|*_`[]":
        text = text.replace(char, f"&#{ord(char)};")
    return text


def _cell(text: str) -> str:
    """A help text for a table cell: its `code spans` kept as code, everything else literal."""
    parts = str(text).split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick is a character, not a code span
        return _literal(text)
    return "".join(f"<code>{_literal(part)}</code>" if index % 2 else _literal(part) for index, part in enumerate(parts))


def _help_paragraphs(text: str | None) -> str:
    if not text:
        return ""
    text = text.replace("\b\n", "").replace("\b", "")
    return html.escape(text.strip(), quote=False)


def _option_row(param, context) -> tuple[str, str, str]:
    record = param.get_help_record(context)
    if record is None:  # hidden
        return "", "", ""
    names, help_text = record
    default = ""
    match = re.search(r"\s*\[default: (.*?)\]\s*$", help_text)
    if match:
        default, help_text = match.group(1), help_text[: match.start()]
    elif getattr(param, "is_bool_flag", False) and getattr(param, "secondary_opts", None):
        # typer shows no default for a --x/--no-x pair; the flag that is on by default is the default
        default = param.opts[0] if param.default else param.secondary_opts[0]
    match = re.search(r"\s*\[env var: (.*?)\]", help_text)
    if match:
        help_text = help_text[: match.start()] + help_text[match.end():] + f" (environment variable `{match.group(1)}`)"
    required = help_text.rstrip().endswith("[required]")
    if required:
        help_text = help_text.rstrip()[: -len("[required]")].rstrip()
        default = "required"
    default_text = "required" if required else (f"default: `{default}`" if default else "")
    return f"`{names}`", _cell(help_text), default_text


def render_command(path: tuple[str, ...]) -> str:
    """One command's reference: description, usage, its options grouped as `--help` groups them,
    its epilog, and its sub-commands (each documented by its own directive)."""
    command, context = find(path)
    full = f"{PROG} {' '.join(path)}"
    out = [f"## `{full}`", ""]
    if command.help:
        out += [_help_paragraphs(command.help), ""]
    out += ["```text", command.get_usage(context).replace("Usage: ", "", 1), "```", ""]
    groups: dict[str, list[tuple[str, str, str]]] = {}
    arguments: list[tuple[str, str, str]] = []
    for param in command.params:
        if getattr(param, "hidden", False):
            continue
        row = _option_row(param, context)
        if not row[0]:
            continue
        if param.param_type_name == "argument":
            arguments.append(row)
        else:
            groups.setdefault(getattr(param, "rich_help_panel", None) or "Options", []).append(row)

    def items(rows):
        return [f"- **{name}**" + (f" ({default})" if default else "") + (f": {text}" if text else "") for name, text, default in rows]

    if arguments:
        out += ["**Arguments**", "", *items(arguments), ""]
    ordered = sorted(groups, key=lambda group: group != "Options")  # the ungrouped ones first, as --help
    for group in ordered:
        out += [f"**{group}**", "", *items(groups[group]), ""]
    if command.epilog:
        out += ["```text", command.epilog.replace("\b\n", "").replace("\b", "").strip(), "```", ""]
    children = [name for name in getattr(command, "list_commands", lambda _c: [])(context)]
    if children:
        out += ["**Sub-commands:** " + ", ".join(f"`{full} {name}`" for name in children), ""]
    return "\n".join(out)


# ---- drafter defaults --------------------------------------------------------------------------------


def _field_default(name: str):
    from draftsmith.train.config import TrainConfig

    return TrainConfig.model_fields[name].default


def _flag(name: str) -> str:
    from draftsmith.core.config import options_of
    from draftsmith.train.config import TrainConfig

    for option in options_of(TrainConfig):
        if option.path == (name,):
            return option.flag
    raise KeyError(name)


def defaults_rows(variant: str) -> list[tuple[str, str, str]]:
    """(setting, flag, default) of a drafter variant as `draftsmith train` runs it without flags."""
    from draftsmith.model.config import default_target_layer_ids
    from draftsmith.model.dspark import DEFAULT_MARKOV_RANK
    from draftsmith.train import loss

    if variant not in ("dflash", "dspark"):
        raise KeyError(f"no drafter variant {variant!r}: dflash or dspark")
    block = _field_default("block_size")
    predictions = block - 1 if variant == "dflash" else block
    features = _field_default("num_features")

    def value(name: str) -> str:
        default = _field_default(name)
        if isinstance(default, tuple):
            return ", ".join(f"{item:g}" if isinstance(item, float) else str(item) for item in default)
        return f"{default:g}" if isinstance(default, float) else str(default)

    rows = [
        ("variant", _flag("drafter"), variant),
        ("block size B", _flag("block_size"), str(block)),
        ("tokens drafted per block", "", f"{predictions} (" + ("B − 1: the anchor, then B − 1 masks" if variant == "dflash"
                                                                 else "B: every position predicts the next token") + ")"),
        ("serve with vLLM `num_speculative_tokens`", "", str(predictions)),
        ("draft decoder layers", _flag("num_draft_layers"), value("num_draft_layers")),
        ("captured target layers", _flag("num_features"), f"{features}, spread over the target (a 36-layer target: "
                                                           f"{default_target_layer_ids(36, features)}; never its last layer)"),
        ("anchors (blocks) per document", _flag("num_anchors"), value("num_anchors")),
        ("max sequence length", _flag("max_length"), value("max_length")),
    ]
    if variant == "dflash":
        rows += [
            ("loss", _flag("loss_weights"), f"{value('loss_weights')}: Σ w·CE / Σ w, w_k = exp(−(k−1)/γ)"),
            ("γ (position decay)", _flag("gamma"), f"{loss.default_gamma(block):g} at B {block} "
             f"(by block size: {', '.join(f'{g:g} at B {b}' for b, g in sorted(loss.DEFAULT_GAMMA.items(), reverse=True))})"),
            ("D-PACE α (with `--loss-weights dpace`)", _flag("dpace_alpha"), f"{loss.DEFAULT_DPACE_ALPHA:g}"),
        ]
    else:
        rows += [
            ("Markov head rank r", _flag("markov_rank"), f"{DEFAULT_MARKOV_RANK} (the whole vocabulary when it is smaller; "
                                                         "a resumed run keeps its own)"),
            ("confidence head", _flag("confidence_head"), "on" if _field_default("confidence_head") else "off"),
            ("loss", "", f"{loss.DSPARK_CE_WEIGHT:g} × CE + {loss.DSPARK_TV_WEIGHT:g} × ‖p_draft − p_target‖₁ "
                         f"+ {loss.DSPARK_CONFIDENCE_WEIGHT:g} × BCE(confidence)"),
            ("γ (position decay)", _flag("gamma"), f"{loss.default_gamma(block + 1):g} at B {block} (as for a DFlash block of B + 1)"),
        ]
    rows += [
        ("epochs", _flag("epochs"), value("epochs")),
        ("peak learning rate (AdamW, cosine)", _flag("lr"), value("lr")),
        ("warm-up share", _flag("warmup_ratio"), value("warmup_ratio")),
        ("AdamW betas", _flag("betas"), value("betas")),
        ("weight decay", _flag("weight_decay"), value("weight_decay")),
        ("gradient clipping", _flag("grad_clip"), value("grad_clip")),
        ("micro-batch (sequences per process)", _flag("batch_size"), value("batch_size")),
        ("dtype", _flag("dtype"), "auto (bf16 on CUDA, fp32 on CPU)"),
        ("attention", _flag("attention"), "auto (sparse on CPU, flex on CUDA)"),
        ("seed", _flag("seed"), value("seed")),
    ]
    return rows


def render_defaults(variant: str) -> str:
    out = ["| setting | flag | default |", "|---|---|---|"]
    for setting, flag, default in defaults_rows(variant):
        out.append(f"| {setting} | {f'`{flag}`' if flag else ''} | {default} |")
    out += ["", "_Read from `draftsmith.train.config.TrainConfig` and `draftsmith.train.loss` when this site was built._", ""]
    return "\n".join(out)


# ---- the hook ------------------------------------------------------------------------------------------


def expand(markdown: str) -> str:
    def replace(match: re.Match) -> str:
        kind, argument = match.group(1), match.group(2).split()
        if kind == "cli":
            return render_command(tuple(argument))
        if len(argument) != 1:
            raise KeyError(f"'::: draftsmith defaults' takes one variant, got {argument}")
        return render_defaults(argument[0])

    return DIRECTIVE.sub(replace, markdown)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (mkdocs' hook signature)
    try:
        return expand(markdown)
    except KeyError as error:
        from mkdocs.exceptions import PluginError

        raise PluginError(f"{page.file.src_path}: {error.args[0]}") from None

"""The documentation site (docs/, mkdocs.yml) and the README that points into it.

The CLI reference is generated at build time from the typer app by docs/hooks/generated.py; these
tests walk the app's command tree on their own and fail when a command has no reference page, when a
page names a command the app no longer has, or when `mkdocs build --strict` (broken links, a page
left out of the nav, an unknown directive) fails.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from draftsmith.cli import app

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CLI_PAGES = DOCS / "reference" / "cli"
DIRECTIVE = re.compile(r"^::: draftsmith cli (.+?)\s*$", re.MULTILINE)


def app_commands() -> set[tuple[str, ...]]:
    """Every command and sub-command path of the `draftsmith` app (typer's click tree)."""
    found: set[tuple[str, ...]] = set()

    def walk(command, path, parent):
        context = command.context_class(command, info_name=path[-1] if path else "draftsmith", parent=parent)
        if path:
            found.add(path)
        for name in getattr(command, "list_commands", lambda _context: [])(context):
            walk(command.get_command(context, name), (*path, name), context)

    walk(typer.main.get_command(app), (), None)
    return found


def documented_commands() -> dict[tuple[str, ...], list[str]]:
    pages: dict[tuple[str, ...], list[str]] = {}
    for page in sorted(CLI_PAGES.glob("*.md")):
        for match in DIRECTIVE.finditer(page.read_text()):
            pages.setdefault(tuple(match.group(1).split()), []).append(page.name)
    return pages


def load_hook():
    spec = importlib.util.spec_from_file_location("docs_generated_hook", DOCS / "hooks" / "generated.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_command_and_sub_command_has_exactly_one_reference_page():
    commands, documented = app_commands(), documented_commands()
    assert ("plan", "train") in commands and ("models", "fetch") in commands  # the walk reaches sub-commands
    missing = sorted(" ".join(path) for path in commands - documented.keys())
    assert not missing, f"commands without a page under docs/reference/cli (add '::: draftsmith cli <command>'): {missing}"
    stale = sorted(" ".join(path) for path in documented.keys() - commands)
    assert not stale, f"reference pages name commands the app does not have: {stale}"
    twice = {" ".join(path): pages for path, pages in documented.items() if len(pages) > 1}
    assert not twice, f"commands documented on more than one page: {twice}"
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in CLI_PAGES.glob("*.md"):
        assert f"reference/cli/{page.name}" in nav, f"{page} is not in mkdocs.yml's nav"


def test_the_generated_reference_shows_every_flag_of_every_command():
    hook = load_hook()
    for path, command, context in hook.walk():
        text = hook.render_command(path)
        for param in command.params:
            if getattr(param, "hidden", False):
                continue
            # an argument shows as its metavar (or its name), as `--help` shows it
            names = param.opts if param.param_type_name == "option" else [param.get_help_record(context)[0].split()[0]]
            for name in names:
                assert name in text, f"`draftsmith {' '.join(path)}`: {name} missing from its generated reference"


def test_an_unknown_command_or_variant_fails_the_build():
    hook = load_hook()
    with pytest.raises(KeyError, match="not a command"):
        hook.expand("::: draftsmith cli plan nonsense\n")
    with pytest.raises(KeyError, match="no drafter variant"):
        hook.expand("::: draftsmith defaults medusa\n")


def test_each_drafter_page_shows_its_defaults_from_the_config():
    from draftsmith.model.dspark import DEFAULT_MARKOV_RANK
    from draftsmith.train.config import TrainConfig

    hook = load_hook()
    for variant in ("dflash", "dspark"):
        assert f"::: draftsmith defaults {variant}" in (DOCS / "drafters" / f"{variant}.md").read_text()
    block = TrainConfig.model_fields["block_size"].default
    dflash, dspark = hook.render_defaults("dflash"), hook.render_defaults("dspark")
    assert f"| `--block-size` | {block} |" in dflash
    assert f"| serve with vLLM `num_speculative_tokens` |  | {block - 1} |" in dflash
    assert f"| serve with vLLM `num_speculative_tokens` |  | {block} |" in dspark
    assert f"| `--markov-rank` | {DEFAULT_MARKOV_RANK} " in dspark


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    reason = "the docs site needs the docs extra: pip install -e '.[docs]'"
    pytest.importorskip("mkdocs", reason=reason)
    pytest.importorskip("material", reason=reason)
    pytest.importorskip("mkdocs_llmstxt", reason=reason)
    site = tmp_path / "site"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(site)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "::: draftsmith" not in (site / "reference" / "cli" / "plan-train" / "index.html").read_text()
    assert "--num-anchors" in (site / "reference" / "cli" / "plan-train" / "index.html").read_text()
    llms = (site / "llms.txt").read_text()
    assert "getting-started" in llms and "reference/cli/train" in llms


def command_lines(text: str) -> list[str]:
    """Each `draftsmith ...` command line in a page's code blocks, continuation lines joined."""
    lines, inside, pending = [], False, ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            inside, pending = not inside, ""
            continue
        if not inside:
            continue
        line = pending + line.split("  #")[0].split(" # ")[0]
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1] + " "
            continue
        pending = ""
        words = line.replace("$ ", "", 1).split()
        if "draftsmith" in words:
            lines.append(" ".join(words[words.index("draftsmith"):]))
    return lines


def test_every_flag_a_page_shows_in_a_command_exists():
    # A page's example is copied into shells: a flag the command does not have would fail there.
    hook = load_hook()
    commands = {path: command for path, command, _context in hook.walk()}
    checked = 0
    for page in user_docs():
        for line in command_lines(page.read_text()):
            words = line.split()[1:]
            path = ()
            while words and (*path, words[0]) in commands:
                path, words = (*path, words[0]), words[1:]
            if not path:
                continue
            flags = {"--help"} | {name for param in commands[path].params for name in (*param.opts, *param.secondary_opts)}
            for word in words:
                flag = word.split("=")[0].strip("'\"")
                if flag.startswith("--") and flag not in flags:
                    pytest.fail(f"{page.relative_to(ROOT)}: `{line}`: `draftsmith {' '.join(path)}` has no {flag}")
            checked += 1
    assert checked > 50
def user_docs() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_user_docs_carry_no_issue_numbers_of_this_project():
    # Development history belongs in the tracker; a peer's bug cited by its repository stays.
    pattern = re.compile(r"\((?:issue \d+|item \d+)|\bissue \d+ item \d+|the issue asks", re.IGNORECASE)
    found = [f"{page.relative_to(ROOT)}:{number}: {line.strip()}" for page in user_docs()
             for number, line in enumerate(page.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, "\n".join(found)


def test_readme_stays_short_and_its_links_into_the_docs_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    links = re.findall(r"\]\((docs/[^)#\s]+)", readme)
    assert links, "the README maps the docs"
    for link in links:
        assert (ROOT / link).is_file(), f"README links to {link}, which does not exist"



"""Reading README.md and docs/*.md for tests/test_docs_commands.py: their fenced blocks and prose, the commands they
show, and what can be seen wrong with a command without running it.

A command is a line of a fenced bash/sh/console block, or an inline code span that starts with a program
(`te-verify`, `pytest`, `python`, `.venv/bin/python`, `torchrun`, `bash`). A command with placeholders (`DIR`,
`OLD/results.json`, `<number of GPUs>`, `...`) or a bare subcommand named in prose (`te-verify report merge`) is a
pattern: checked statically, never run.
"""
from __future__ import annotations

import ast
import re
import shlex
import tomllib
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAMS = ("te-verify", "pytest", "python", ".venv/bin/python", "torchrun", "bash", "pip", "source")
INLINE = tuple(p + " " for p in PROGRAMS if p not in ("pip", "source"))
SHELL = ("bash", "sh", "console", "shell")
REPO_DIRS = ("cases/", "tests/", "scripts/", "examples/", "te_verify/", "expectations/", "docs/", ".github/", ".ci/")
PLACEHOLDER = re.compile(r"^(\.\.\.|<.*|[A-Z][A-Z0-9_]*([./].*)?)$")


# A subcommand named in prose ("`te-verify report merge` puts ... together"): a name, not a command to run.
SUBCOMMANDS = {"te-verify run", "te-verify report", "te-verify report merge", "te-verify report diff",
               "te-verify report html", "te-verify expectations update"}


def strip_comment(line: str) -> str:
    """`line` without a trailing `#` comment (one outside quotes, after a blank or at the start)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
    return line.rstrip()


class Page(NamedTuple):
    path: Path
    # (info string, body) of every fenced block.
    blocks: list[tuple[str, str]]
    # The text outside fenced blocks.
    prose: str
    # The page's line number of each block's first body line, in the order of `blocks`.
    starts: tuple[int, ...] = ()


def read_page(path: Path) -> Page:
    blocks, prose, fence, starts = [], [], None, []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        stripped = line.strip()
        if fence is None and stripped.startswith("```"):
            fence, body = stripped[3:].strip() or "text", []
            starts.append(number + 1)
        elif fence is not None and stripped == "```":
            blocks.append((fence, "\n".join(body)))
            fence = None
        elif fence is not None:
            body.append(line)
        else:
            prose.append(line)
    return Page(path, blocks, "\n".join(prose), tuple(starts[:len(blocks)]))


def commands(page: Page) -> list[str]:
    found = []
    for info, body in page.blocks:
        if info in SHELL:
            for line in body.replace("\\\n", " ").splitlines():
                line = strip_comment(line.strip().removeprefix("$ "))
                found += [" ".join(line.split())] if line else []
    spans = (" ".join(span.split()) for span in re.findall(r"`([^`]+)`", page.prose))
    return found + [span for span in spans if span.startswith(INLINE)]


def documented() -> list[tuple[str, str]]:
    """(page name, command) for every command, each once per page."""
    return sorted({(page.path.name, command) for page in map(read_page, PAGES) for command in commands(page)})


def is_pattern(command: str) -> bool:
    """A name or a pattern with placeholders: checked statically, never run."""
    return command in SUBCOMMANDS or any(PLACEHOLDER.match(token) for token in split(command))


def split(command: str) -> list[str]:
    """The command's words, a `<placeholder of several words>` as one."""
    return shlex.split(re.sub(r"<[^>]*>", lambda m: m.group(0).replace(" ", "_"), command))


def option_table(pytestconfig) -> dict[str, bool]:
    """Every option this pytest knows -> whether it takes a value."""
    parser = pytestconfig._parser
    options = list(parser._anonymous.options) + [o for group in parser._groups for o in group.options]
    return {name: takes_value(o) for o in options for name in o.names()}


def takes_value(option) -> bool:
    """Whether a pytest option takes a value (pytest 9 wraps argparse's action; earlier ones keep its keywords)."""
    action = getattr(option, "_action", None)
    if action is not None:
        return action.nargs != 0
    return option._attrs.get("action") not in ("store_true", "store_false", "count", "help", "version", "store_const")


def check_value(option: str, value: str) -> str | None:
    """What is wrong with `value` of `option`, or None."""
    from te_verify.backends.registry import BUILTINS, DIST_WRAPPERS
    from te_verify.distributed.declare import declared_wrapper
    from te_verify.matrix.shard import parse_shard
    from te_verify.matrix.tiers import TIERS
    from te_verify.objects import load_path
    from te_verify.te import api as te_api

    if PLACEHOLDER.match(value):
        return None
    try:
        if option == "--backend" and value not in BUILTINS and value not in DIST_WRAPPERS:
            load_path(value)
        elif option == "--wrap" and declared_wrapper(value) is None:
            return f"--wrap {value}: not a wrapper declaration"
        elif option == "--te-impl" and value not in ("transformer_engine", te_api.CPU_CHOICE, "reference"):
            te_api.resolve(value)
        elif option == "--shard":
            parse_shard(value)
        elif option == "--tier" and value not in TIERS:
            return f"--tier {value}: not a tier"
        elif option == "--device" and not re.fullmatch(r"cpu|cuda(:\d+)?", value):
            return f"--device {value}: not a device"
    except Exception as exc:  # noqa: BLE001  (any failure to load is the finding)
        return f"{option} {value}: {type(exc).__name__}: {exc}"
    return None


def check_args(tokens: list[str], known: dict[str, bool], positional_paths: bool) -> list[str]:
    """Options known and their values sound; positional arguments existing repository paths where they must be."""
    problems, i = [], 0
    while i < len(tokens):
        token = tokens[i]
        name, _, inline = token.partition("=")
        if token.startswith("-") and name in known:
            value = inline or (tokens[i + 1] if known[name] and not inline and i + 1 < len(tokens) else None)
            i += 1 if inline or not known[name] else 2
            problems += [p for p in [value and check_value(name, value)] if p]
            continue
        if token.startswith("-"):
            problems.append(f"{token}: no such option")
        elif positional_paths and not PLACEHOLDER.match(token) and not (ROOT / token).exists():
            problems.append(f"{token}: no such file")
        i += 1
    return problems


def static_problems(command: str, known: dict[str, bool]) -> list[str]:
    """Everything wrong with `command` that can be seen without running it."""
    from te_verify import cli
    from te_verify.distributed import __main__ as torchrun_entry

    tokens = split(command)
    program, args = tokens[0], tokens[1:]
    problems = [f"{t}: no such file" for t in tokens if t.startswith(REPO_DIRS) and not (ROOT / t).exists()]
    if program not in PROGRAMS:
        return problems + [f"{program}: not a program the docs may use ({', '.join(PROGRAMS)})"]
    if program == "te-verify" and args[:1] == ["run"]:
        run_options = {n: a.nargs != 0 for a in cli.build_parser()._subparsers._group_actions[0].choices["run"]._actions
                       for n in a.option_strings}
        problems += check_args(args[1:], {**known, **run_options}, positional_paths=False)
    elif program == "te-verify":
        if args[:1] not in (["report"], ["expectations"]):
            problems.append(f"te-verify {args[:1]}: no such subcommand")
        elif args[:1] == ["expectations"] and not is_pattern(command):
            try:
                cli.build_parser().parse_args(args)
            except SystemExit:
                problems.append("te-verify expectations: its parser refuses the arguments")
    elif program == "pytest":
        problems += check_args(args, known, positional_paths=True)
    elif program == "torchrun":
        from torch.distributed.run import get_args_parser

        try:
            parsed = get_args_parser().parse_args(args)
        except SystemExit:
            return problems + ["torchrun: its parser refuses the arguments"]
        if not (parsed.module and parsed.training_script == "te_verify.distributed"):
            problems.append("torchrun: runs something other than -m te_verify.distributed")
        try:
            entry = torchrun_entry.parse(parsed.training_script_args)
        except SystemExit:
            return problems + ["te_verify.distributed: its parser refuses the arguments"]
        problems += [p for p in (check_value("--wrap", entry.wrap) if entry.wrap else None,
                                 check_value("--tier", entry.tier)) if p]
    elif program in ("python", ".venv/bin/python", "bash", "source"):
        script = ROOT / args[0]
        if not script.exists():
            return problems + [f"{args[0]}: no such file"]
        if script.suffix == ".py":  # a shell script hands its options on (run.sh to te-verify run)
            declared = script.read_text()
            problems += [f"{t}: not an option of {args[0]}" for t in args[1:] if t.startswith("--")
                         and f'"{t}"' not in declared]
    return problems


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")


def link_problems(page: Page) -> list[str]:
    """Every relative link of the page to a file that exists, and to a heading there where it names one."""
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.prose):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (page.path.parent / file).resolve() if file else page.path
        if not path.exists():
            problems.append(f"{page.path.name}: link {target}: no such file")
        elif anchor and anchor not in {slug(h) for h in re.findall(r"^#+ (.+)$", path.read_text(), re.M)}:
            problems.append(f"{page.path.name}: link {target}: no such heading in {path.name}")
    return problems


def path_problems(page: Page) -> list[str]:
    """Inline code naming a repository path (no placeholder in it) that does not exist."""
    return [f"{page.path.name}: `{span}` does not exist" for span in re.findall(r"`([^`\s]+)`", page.prose)
            if span.startswith(REPO_DIRS) and not re.search(r"[<>*]", span) and not (ROOT / span).exists()]


def example_problems(page: Page) -> list[str]:
    """Python and TOML blocks that do not parse; lines of a Python block naming its file (`# examples/x.py`) that
    are not in that file (comments and `...` aside)."""
    problems = []
    for info, body in page.blocks:
        where = f"{page.path.name}: a {info} block"
        try:
            ast.parse(body) if info == "python" else tomllib.loads(body) if info == "toml" else None
        except (SyntaxError, tomllib.TOMLDecodeError) as exc:
            problems.append(f"{where} does not parse: {exc}")
            continue
        named = re.match(r"# (\S+\.py)\b", body)
        if info != "python" or named is None:
            continue
        source = ROOT / named.group(1)
        if not source.exists():
            problems.append(f"{where} names {named.group(1)}, which does not exist")
            continue
        lines = {strip_comment(line).strip() for line in source.read_text().splitlines()}
        problems += [f"{where}: `{code}` is not in {named.group(1)}" for line in body.splitlines()[1:]
                     if (code := strip_comment(line).strip()) not in ("", "...") and code not in lines]
    return problems

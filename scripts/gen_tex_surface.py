#!/usr/bin/env python3
"""Write the Python-visible surface of TE's `transformer_engine_torch` extension as JSON.

Read statically from the transformer-engine-torch sdist (no CUDA build), so our pure-PyTorch
emulation can expose exactly one TE version's functions, classes, submodules and enum values.
Usage: python scripts/gen_tex_surface.py VERSION [--sdist PATH] [--out DIR]
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import io
import json
import re
import sys
import tarfile
import urllib.request
from pathlib import Path
from typing import Callable, Iterator

SIMPLE_INDEX = "https://pypi.org/simple/transformer-engine-torch/"
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "te_verify" / "te" / "tecpu" / "surfaces"
PY = r"(?:py|pybind11)"  # both namespace spellings occur in TE's sources
QUALIFIED = r"[A-Za-z_]\w*(?:\s*::\s*[A-Za-z_]\w*)*"
LITERAL = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'')


class SurfaceError(Exception):
    """A fact about the surface could not be established; reported as a one-line error."""


class Unresolved(SurfaceError):
    """An enumerator without an integer value; its message names enum, member and expression."""


def download_sdist(version: str) -> tuple[str, bytes]:
    """Fetch the sdist via PyPI's JSON simple API (pip download fails: its metadata build fails)."""
    filename = f"transformer_engine_torch-{version}.tar.gz"
    req = urllib.request.Request(SIMPLE_INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        entry = next((f for f in json.load(resp)["files"] if f["filename"] == filename), None)
    if entry is None:
        raise SurfaceError(f"{filename} is not listed on {SIMPLE_INDEX}")
    with urllib.request.urlopen(entry["url"], timeout=300) as resp:
        data = resp.read()
    if hashlib.sha256(data).hexdigest() != entry["hashes"]["sha256"]:
        raise SurfaceError(f"sha256 mismatch for downloaded {filename}")
    return filename, data


def read_sources(data: bytes) -> dict[str, str]:
    """csrc/**/*.{cpp,h} and common_headers/**/*.h, keyed by path below the sdist's top folder."""
    sources: dict[str, str] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            rel = member.name.split("/", 1)[-1]
            if member.isfile() and ((rel.startswith("csrc/") and rel.endswith((".cpp", ".h")))
                                    or (rel.startswith("common_headers/") and rel.endswith(".h"))):
                sources[rel] = tar.extractfile(member).read().decode("utf-8", "replace")
    return sources


def clean_source(text: str, keep_macro_bodies: bool = False) -> str:
    """Drop comments and preprocessor lines, keeping string literals (docstrings may hold '//').
    keep_macro_bodies keeps #define bodies: NVTE_DECLARE_COMMON_PYBIND11_HANDLES(m) registers
    enums and functions from inside a macro."""
    text = re.sub(r"\\\r?\n", " ", text)  # splice continuation lines first, as cpp does
    text = re.sub(LITERAL.pattern + r"|//[^\n]*|/\*.*?\*/",
                  lambda m: m.group(0) if m.group(0)[0] in "\"'" else " ", text, flags=re.S)
    return re.sub(r"(?m)^[ \t]*#[ \t]*define[ \t]+\w+(?:\([^)]*\))?(.*)$|^[ \t]*#.*$",
                  lambda m: (m.group(1) or "") if keep_macro_bodies else "", text)


def walk(text: str, start: int = 0) -> Iterator[tuple[int, str, int]]:
    """Yield (index, char, bracket depth after it) for characters outside string/char literals."""
    depth, i = 0, start
    while i < len(text):
        literal = LITERAL.match(text, i) if text[i] in "\"'" else None
        if literal:
            i = literal.end()
            continue
        depth += (text[i] in "([{") - (text[i] in ")]}")
        yield i, text[i], depth
        i += 1


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on `sep` outside brackets and literals: f(a, b) is one item."""
    cuts = [i for i, c, depth in walk(text) if c == sep and depth == 0]
    return [text[a + 1:b].strip() for a, b in zip([-1] + cuts, cuts + [len(text)])]


def call_args(text: str, open_paren: int) -> list[str]:
    """Arguments of the call whose '(' sits at open_paren."""
    close = next((i for i, c, d in walk(text, open_paren) if d == 0 and c == ")"), None)
    if close is None:
        raise SurfaceError(f"unbalanced call near {oneline(text[open_paren:open_paren + 60])!r}")
    return split_top_level(text[open_paren + 1:close])


def statement(text: str, start: int) -> str:
    """Text from start up to the ';' ending the statement (a lambda's ';' is nested)."""
    return next((text[start:i] for i, c, d in walk(text, start) if d == 0 and c == ";"), text[start:])


def skip_template(text: str, lt: int) -> int:
    """Index just past the '>' matching the '<' at lt."""
    depth = 0
    for i in range(lt, len(text)):
        depth += (text[i] == "<") - (text[i] == ">")
        if depth == 0:
            return i + 1
    raise SurfaceError(f"unbalanced template near {oneline(text[lt:lt + 60])!r}")


def oneline(text: str) -> str:
    return " ".join(text.split())


class EnumTable:
    """All C/C++ enums in the sources. Values are resolved lazily, so enumerators that nothing
    registers (function-local enums, exotic initialisers) can never fail a run."""

    def __init__(self) -> None:
        self.raw: dict[str, dict[str, str | None]] = {}  # enum -> member -> initialiser or None
        self.unscoped: dict[str, set[str]] = {}  # C-style enumerator -> enums declaring it
        self.clashes: set[str] = set()  # enum names declared twice with different members
        self.values: dict[tuple[str, str], int] = {}
        self.busy: set[tuple[str, str]] = set()  # guards against A = B, B = A cycles

    def add_source(self, text: str) -> None:
        pat = (r"\b(typedef\s+)?enum\b\s*(class\b|struct\b)?\s*(\w+)?\s*(?::\s*[\w:\s]+?)?\s*"
               r"\{([^{}]*)\}\s*(\w+)?\s*;")
        for typedef, scoped, tag, body, declarator in re.findall(pat, text):
            members = {}
            for item in filter(None, split_top_level(body)):
                name, _, init = item.partition("=")
                members[name.split()[0]] = oneline(init) or None
            # `typedef enum {...} Name;` is named by its declarator; `enum Tag {...} var;` is not
            names = [n for n in (tag, declarator if typedef else "") if n] or [f"<anon {len(self.raw)}>"]
            for name in names:  # e.g. two function-local `enum class Impl`: fatal only if used
                if self.raw.setdefault(name, members) != members:
                    self.clashes.add(name)
            if not scoped:  # C-style enumerators are visible unqualified
                for member in members:
                    self.unscoped.setdefault(member, set()).add(names[0])

    def lookup(self, ident: str, context: str | None) -> int:
        """Value of a possibly qualified enumerator, seen from inside enum `context`."""
        parts = [p.strip() for p in ident.split("::")]
        member = parts[-1]
        if len(parts) >= 2 and member in self.raw.get(parts[-2], {}):
            return self.value(parts[-2], member)
        if context and member in self.raw.get(context, {}):
            return self.value(context, member)
        owners = self.unscoped.get(member, set())
        if len(owners) == 1:
            return self.value(next(iter(owners)), member)
        raise SurfaceError(f"{'ambiguous' if owners else 'unknown'} enumerator {oneline(ident)!r}")

    def value(self, enum: str, member: str) -> int:
        if enum in self.clashes:
            raise SurfaceError(f"enum {enum} is declared more than once with different members")
        key = (enum, member)
        if key not in self.values:
            if key in self.busy:
                raise SurfaceError(f"cyclic definition of {enum}.{member}")
            self.busy.add(key)
            init, members = self.raw[enum][member], list(self.raw[enum])
            try:
                if init is not None:
                    self.values[key] = eval_int_expr(init, lambda ident: self.lookup(ident, enum))
                else:  # C rule: the first enumerator is 0, any other is previous + 1
                    idx = members.index(member)
                    self.values[key] = self.value(enum, members[idx - 1]) + 1 if idx else 0
            except Unresolved:
                raise  # the innermost failing enumerator is the one worth naming
            except SurfaceError as exc:
                raise Unresolved(f"cannot resolve {enum}.{member} = {init or '<implicit>'}: {exc}") from None
        return self.values[key]


INT_OPS: dict[type, Callable[..., int]] = {
    ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: int(a / b), ast.Mod: lambda a, b: a - b * int(a / b),  # C truncates
    ast.LShift: lambda a, b: a << b, ast.RShift: lambda a, b: a >> b, ast.BitOr: lambda a, b: a | b,
    ast.BitAnd: lambda a, b: a & b, ast.BitXor: lambda a, b: a ^ b,
    ast.USub: lambda a: -a, ast.UAdd: lambda a: a, ast.Invert: lambda a: ~a,
}


def c_int_literal(token: str) -> int:
    """An integer literal with its suffix dropped: 0x.. is hex, 0.. octal, anything else decimal."""
    if token[:2] in ("0x", "0X"):
        return int(token, 16)
    return int(token, 8) if token.startswith("0") else int(token)


def eval_int_expr(expr: str, lookup: Callable[[str], int]) -> int:
    """Evaluate a C integer constant expression; identifiers are enumerators resolved by lookup."""
    e = re.sub(r"\b(?:static_cast|reinterpret_cast)\s*<[^<>]*>", "", expr)  # keeps the (operand)
    e = re.sub(r"\(\s*(?:(?:unsigned|signed|const|int|long|short|char|size_t|u?int\d+_t)\s*)+\)", "", e)
    e = re.sub(r"\b(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9]\d*)[uUlL]*\b", lambda m: str(c_int_literal(m[1])), e)
    e = re.sub(QUALIFIED, lambda m: f"({lookup(m[0])})", e).replace("/", "//")

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in INT_OPS:
            return INT_OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in INT_OPS:
            return INT_OPS[type(node.op)](ev(node.operand))
        raise SurfaceError(f"unsupported expression {oneline(expr)!r}")
    try:
        return ev(ast.parse(e.strip(), mode="eval").body)
    except SyntaxError:
        raise SurfaceError(f"unsupported expression {oneline(expr)!r}") from None


def collect_registrations(text: str, enums: EnumTable, found: dict) -> None:
    """Add one cleaned file's module-level m.def / class_ / enum_ / def_submodule to `found`."""
    modules = {"m"} | set(re.findall(PY + r"\s*::\s*module_?\s*&\s*(\w+)", text))  # helper params
    modules |= set(re.findall(r"PYBIND11_MODULE\s*\(\s*\w+\s*,\s*(\w+)", text))
    mod = "|".join(sorted(modules))
    found["functions"].update(re.findall(rf"(?<![\w.])(?:{mod})\s*\.\s*def\s*\(\s*\"(\w+)\"", text))
    for var, name in re.findall(rf"(\w+)\s*=\s*(?:{mod})\s*\.\s*def_submodule\s*\(\s*\"(\w+)\"", text):
        fns = re.findall(rf"(?<![\w.]){var}\s*\.\s*def\s*\(\s*\"(\w+)\"", text)
        found["submodules"].setdefault(name, set()).update(fns)
    for m in re.finditer(PY + r"\s*::\s*(class_|enum_)\s*<", text):
        end = skip_template(text, m.end() - 1)
        paren = re.compile(r"\s*\(").match(text, end)
        args = call_args(text, paren.end() - 1) if paren else []
        if len(args) < 2 or args[0] not in modules or not args[1].startswith('"'):
            continue  # a type alias, or a name nested in a class or submodule
        if m[1] == "class_":
            found["classes"].add(args[1].strip('"'))
        else:
            cpp_enum = re.split(r"\s*::\s*", text[m.end():end - 1].strip())[-1]
            found["enums"][args[1].strip('"')] = enum_values(
                statement(text, paren.end() - 1), args[1].strip('"'), cpp_enum, enums)


def enum_values(stmt: str, py_name: str, cpp_enum: str, enums: EnumTable) -> dict[str, int]:
    """Resolve each `.value("X", expr)` of one py::enum_<cpp_enum>(...) statement to its int."""
    values: dict[str, int] = {}
    for m in re.finditer(r"\.\s*value\s*\(", stmt):
        args = call_args(stmt, m.end() - 1)
        if len(args) < 2 or not args[0].startswith('"'):
            continue  # e.g. std::optional::value() inside a bound lambda
        member, expr = args[0].strip('"'), args[1]
        try:
            values[member] = eval_int_expr(expr, lambda ident: enums.lookup(ident, cpp_enum))
        except SurfaceError as exc:
            raise Unresolved(f"cannot resolve {py_name}.{member} = {oneline(expr)}: {exc}") from None
    return values


def build_surface(version: str, source: str, sources: dict[str, str]) -> dict:
    enums = EnumTable()
    for path in sorted(sources):
        enums.add_source(clean_source(sources[path]))
    found: dict = {"functions": set(), "classes": set(), "submodules": {}, "enums": {}}
    for path in sorted(sources):
        collect_registrations(clean_source(sources[path], keep_macro_bodies=True), enums, found)
    if not found["functions"]:
        raise SurfaceError("no m.def registrations found: not a transformer_engine_torch sdist?")
    return {  # key order as in the documented schema; every list and inner dict is sorted
        "te_version": version, "source": source, "generator": "scripts/gen_tex_surface.py",
        "functions": sorted(found["functions"]), "classes": sorted(found["classes"]),
        "submodules": {k: sorted(v) for k, v in sorted(found["submodules"].items())},
        "enums": {k: dict(sorted(v.items())) for k, v in sorted(found["enums"].items())},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("version")
    ap.add_argument("--sdist", type=Path, help="local transformer_engine_torch-VERSION.tar.gz")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    try:
        filename, data = (args.sdist.name, args.sdist.read_bytes()) if args.sdist else download_sdist(args.version)
        source = f"{filename} sha256:{hashlib.sha256(data).hexdigest()}"
        surface = build_surface(args.version, source, read_sources(data))
    except SurfaceError as exc:
        print(f"gen_tex_surface: error: {exc}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"tex_{args.version}.json"
    out.write_text(json.dumps(surface, indent=1) + "\n")
    print(f"wrote {out}: {len(surface['functions'])} functions, {len(surface['classes'])} classes, "
          f"{len(surface['enums'])} enums")
    return 0


if __name__ == "__main__":
    sys.exit(main())

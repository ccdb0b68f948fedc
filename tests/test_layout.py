"""The package follows the flow: every module imports only what stands below it, and no import circle exists.

Read from the source (ast), imports inside functions included: a lazy import that goes upward is still an upward
dependency. A failure names the module, the import and the two layers, or the circle's modules in order.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "te_verify"
# The flow, lowest first: (layer, the module prefixes in it). A module may import its own layer and those before it.
LAYERS = (
    ("base", ("spec", "record", "training", "device", "objects", "tmpdirs", "moved")),
    ("te implementations", ("te",)),
    ("compatibility steps", ("compat",)),
    ("matrix", ("matrix",)),
    ("models", ("models",)),
    ("oracle", ("oracle",)),
    ("backends", ("backends",)),
    ("probes", ("probes",)),
    ("checks", ("checks",)),
    ("run", ("run",)),
    ("distributed", ("distributed",)),
    ("expectations", ("expectations",)),
    ("report", ("report",)),
    ("entry points", ("environment", "passes", "plugin", "case_timeout", "run_report", "cli", "distributed.__main__",
                      "distributed.torchrun_end", "__init__")),
    # What user code imports (te_verify.api) and the old paths kept for one release (te_verify.moved's MODULES; the
    # names that left a module are served by that module's own __getattr__).
    ("public surface", ("api", "reference", "tecpu", "te_api")),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def layer_of(module: str) -> int:
    """The layer index of a module (its longest matching prefix)."""
    best, index = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, index = len(prefix), i
    assert index is not None, f"te_verify.{module}: in no layer of tests/test_layout.py's LAYERS"
    return index


def imports(path: Path, modules: set[str]) -> set[str]:
    """The te_verify modules `path` imports (a `from pkg import module` names the module)."""
    me = module_name(path)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = me.split(".")[:len(me.split(".")) - node.level + (path.name == "__init__.py")]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == "te_verify":
                target = node.module.partition(".")[2]
            else:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}" if target else alias.name
                found.add(sub if sub in modules else target)
        elif isinstance(node, ast.Import):
            found |= {a.name.partition(".")[2] for a in node.names if a.name.split(".")[0] == "te_verify"}
    return {m for m in found if m in modules and m != me}


def graph() -> dict[str, set[str]]:
    files = [p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts]
    modules = {module_name(p) for p in files}
    return {module_name(p): imports(p, modules) for p in files}


def test_every_module_imports_only_what_stands_below_it():
    upward = [f"te_verify.{m} ({LAYERS[layer_of(m)][0]}) imports te_verify.{t} ({LAYERS[layer_of(t)][0]})"
              for m, targets in sorted(graph().items()) for t in sorted(targets) if layer_of(t) > layer_of(m)]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each in a stable order."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    found = circles(graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(f"te_verify.{m}" for m in c) for c in found)


def test_the_checker_names_an_upward_import_and_a_circle():
    """The checks above can fail: a planted upward edge and a planted circle are reported."""
    assert layer_of("checks.parity") > layer_of("probes.flops") > layer_of("spec")
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []

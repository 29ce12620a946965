"""The import graph of src/multihead and the layers it must respect.

    python tools/import_layers.py            # check: exit 1 listing every circle / upward arrow
    python tools/import_layers.py --picture  # the layer picture that docs/development.md shows

Every `import` / `from ... import` in every file counts, wherever it stands: at the top, inside
a function (a lazy import is still a dependency), and under `if TYPE_CHECKING:` (an annotation
that names an upper layer's class is knowledge of that layer, and type checkers follow it).
A relative import is resolved against its file; `from pkg import name` is an arrow to
`pkg.name` when that is a module, else to `pkg` (its __init__). Importing `a.b.c` also runs
`a/__init__` and `a/b/__init__`; those implied arrows are not drawn (as grimp / import-linter
read a graph), so a package's __init__ may re-export its own files.

Rules (tests/test_import_graph.py):
  1. no circle between files (strongly connected components of the file graph);
  2. no arrow from a lower layer to a higher one (LAYERS below, bottom first);
  3. no circle between the parts of one layer (folders / top-level files): sideways arrows run
     one way;
  4. every top-level folder or file of the package has a layer.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "multihead"

# Bottom first. A part is a top-level folder or file of src/multihead; `multihead` itself is the
# package's __init__ (it hands out the public names, so it stands on top, beside the command).
LAYERS: list[tuple[str, tuple[str, ...], str]] = [
    (
        "base",
        (
            "value_checks",
            "atomic",
            "table",
            "metric_names",
            "model_layout",
            "factored_matrix",
            "moved",
            "native",
        ),
        "plain helpers: checks, atomic writes, tables, names, a directory's layout, C builds",
    ),
    (
        "functional",
        ("functional", "positional", "hook_points"),
        "attention(), masks, backends; positions; the named hook points modules fire",
    ),
    (
        "modules",
        ("modules", "cache", "static_cache"),
        "the network: attention, blocks, caches, stacks, LM, weights (cache, static_cache: "
        "0.2's paths, deprecated)",
    ),
    (
        "hooked",
        ("hooked",),
        "running a model with hooks: run_with_cache/hooks, ActivationCache, ablate, patch",
    ),
    (
        "models",
        ("models", "compat"),
        "checkpoints into modules: families, GGUF, model checks, text (multihead.CausalLM); "
        "the torch drop-ins",
    ),
    (
        "pretrained",
        ("pretrained", "parallel", "bridge"),
        "multihead.load, sentence encoders; tensor / sequence parallel; the transformers bridge",
    ),
    ("interpret", ("interpret",), "analyses of loaded models: metrics, roles, importance, reports"),
    ("tools", ("bench", "train"), "benchmarks and training demos"),
    (
        "top",
        ("cli", PACKAGE),
        "the `multihead` command; multihead/__init__.py: the public names (imported lazily) "
        "and __version__",
    ),
]


@dataclass(frozen=True)
class Arrow:
    source: str  # module name
    target: str
    line: int
    path: str  # of the source, relative to the repository

    def __str__(self) -> str:
        return f"{self.source} -> {self.target}  ({self.path}:{self.line})"


def modules_of(src: Path) -> dict[str, tuple[Path, bool]]:
    """module name -> (file, is a package __init__) for every .py under src/multihead."""
    found = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        found[".".join(parts)] = (path, is_package)
    return found


def arrows(src: Path) -> list[Arrow]:
    """Every import of one multihead module by another (see the module docstring)."""
    modules = modules_of(src)
    root = src.parent

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    out = set()
    for name, (path, is_package) in modules.items():
        base = name.split(".") if is_package else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parent = base[: len(base) - node.level + 1]
                    module = ".".join(parent + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                targets = [
                    f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module
                    for a in node.names
                ]
            else:
                continue
            for target in targets:
                if target != PACKAGE and not target.startswith(PACKAGE + "."):
                    continue
                resolved = resolve(target)
                if resolved is not None and resolved != name:
                    out.add(Arrow(name, resolved, node.lineno, str(path.relative_to(root))))
    return sorted(out, key=lambda a: (a.source, a.target, a.line))


def part_of(module: str) -> str:
    """The top-level folder or file a module belongs to (`multihead` for the package's own
    __init__)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else PACKAGE


def layer_of(part: str, layers=LAYERS) -> int | None:
    for i, (_, parts, _) in enumerate(layers):
        if part in parts:
            return i
    return None


def circles(edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def problems(src: Path, layers=LAYERS) -> list[str]:
    """Every broken rule, one line each, naming the arrows (empty: the graph is in order)."""
    found = arrows(src)
    out = []
    parts = {part_of(m) for m in modules_of(src)}
    for part in sorted(parts):
        if layer_of(part, layers) is None:
            out.append(f"{PACKAGE}.{part} has no layer: add it to LAYERS in tools/import_layers.py")
    for component in circles((a.source, a.target) for a in found):
        inside = [str(a) for a in found if a.source in component and a.target in component]
        out.append("circle of files: " + " | ".join(inside))
    for a in found:
        low, high = layer_of(part_of(a.source), layers), layer_of(part_of(a.target), layers)
        if low is not None and high is not None and high > low:
            out.append(
                f"upward arrow: {a} ({part_of(a.source)} is in layer {layers[low][0]!r}, "
                f"{part_of(a.target)} in {layers[high][0]!r} above it)"
            )
    sideways = {
        (part_of(a.source), part_of(a.target))
        for a in found
        if part_of(a.source) != part_of(a.target)
    }
    for component in circles(sideways):
        inside = [
            str(a)
            for a in found
            if {part_of(a.source), part_of(a.target)} <= set(component)
            and part_of(a.source) != part_of(a.target)
        ]
        out.append(f"circle of parts {component}: " + " | ".join(inside))
    return out


def picture(layers=LAYERS) -> str:
    """The layers as a mermaid flowchart, top first: each layer imports only from the layers
    below it (the arrows of the picture: `A --> B`, A stands on B). What docs/development.md
    shows; a test keeps the two equal, and another checks the code against the layers."""
    lines = ["```mermaid", "flowchart TB"]
    for name, parts, _ in reversed(layers):
        lines.append(f'    {name}["<b>{name}</b><br/>{" &middot; ".join(parts)}"]')
    names = [name for name, _, _ in reversed(layers)]
    lines.append("    " + " --> ".join(names))
    lines.append("```")
    lines.append("")
    lines.extend(
        f"- **{name}** ({', '.join(parts)}): {what}" for name, parts, what in reversed(layers)
    )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    src = ROOT / "src"
    if "--picture" in argv:
        print(picture())
        return 0
    found = problems(src)
    for line in found:
        print(line)
    if not found:
        print(f"{len(arrows(src))} arrows: no circle, none upward")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The core package's shape: no import circles, and no module importing a layer above its own.

Imports are read from the source (every `import`, including those inside functions, which hide circles
from Python itself), so a circle fails here before it fails in a cold Lambda.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "layers" / "core" / "python"
PACKAGE = "batchinfer"

# Lower layers first; a module may import its own layer or any below it. A module belongs to the layer of
# the longest name that is it or a package holding it (so a module named on its own outranks its package).
LAYERS = [
    {"batchinfer.domain", "batchinfer.layout", "batchinfer.settings", "batchinfer.errors", "batchinfer.catalog",
     "batchinfer.observability", "batchinfer.messages_to_chat", "batchinfer.translating", "batchinfer.addresses",
     "batchinfer.request_bodies", "batchinfer.jsontext", "batchinfer.protocols", "batchinfer.spending"},
    {"batchinfer.storage", "batchinfer.providers"},
    {"batchinfer.runtime"},
    {"batchinfer.records", "batchinfer.ledger"},
    # The scheduler decides what runs when; the service hands it what runs one request (never imported up).
    {"batchinfer.scheduling"},
    {"batchinfer.service"},
    # Each batch API's operations: its terms over the service's use cases, for the routes.
    {"batchinfer.operations"},
    {"batchinfer.api", "batchinfer.cli"},
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, name: str) -> set[str]:
    """The package's modules this one imports (resolving relative imports; `from x import y` counts y
    when y is itself a module)."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == PACKAGE)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != PACKAGE:
                continue
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    """Each module's imports of the package's modules. The root package itself is left out: it holds no
    code (its `__init__` only says what it is), and `from .. import protocols` names it only as the place of
    `protocols`, which counts."""
    assert not _code_of(ROOT / PACKAGE / "__init__.py"), "the root package must stay empty: it belongs to no layer"
    paths = {_module_name(p): p for p in (ROOT / PACKAGE).rglob("*.py")}
    return {name: {i for i in _imports(path, name) if i in paths and i not in (name, PACKAGE)}
            for name, path in paths.items() if name != PACKAGE}


def _code_of(path: Path) -> list[ast.stmt]:
    """A module's statements but its docstring."""
    body = ast.parse(path.read_text()).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return body


def _layer(module: str) -> int:
    matches = [(len(n), rank) for rank, names in enumerate(LAYERS) for n in names
               if module == n or module.startswith(n + ".")]
    if not matches:
        raise AssertionError(f"{module} belongs to no layer: add it to LAYERS in {__file__}")
    return max(matches)[1]


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, or None. A package's __init__ importing its own submodules is not a circle
    unless a submodule imports the package back."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_operations_sit_between_the_service_and_the_routes():
    service, operations = _layer("batchinfer.service.creating.intake"), _layer("batchinfer.operations.openai.batches")
    assert service == _layer("batchinfer.service.running.run_request")
    assert operations == _layer("batchinfer.operations.anthropic.message_batches")
    assert service < operations < _layer("batchinfer.api.routes.batches")


def test_protocols_hold_descriptions_only():
    """A protocol's package is its description (ids, shapes, how its results look), pure and at the bottom:
    its operations, which use storage and the service, are in `operations/`."""
    graph = _graph()
    protocol_modules = [m for m in graph if m == "batchinfer.protocols" or m.startswith("batchinfer.protocols.")]
    assert "batchinfer.protocols.anthropic.shapes" in protocol_modules
    assert {m: _layer(m) for m in protocol_modules} == dict.fromkeys(protocol_modules, 0)


def test_the_service_asks_the_registry_and_never_a_protocols_own_module():
    """Shared code asks `protocols` (the registry) by a batch's `api` or id; a protocol's own package
    (`protocols.openai`, `protocols.anthropic`, their shapes) and the operations are not the service's to use."""
    offenders = [f"{m} imports {i}" for m, imports in _graph().items() if m.startswith("batchinfer.service.")
                 for i in imports if i.startswith(("batchinfer.protocols.", "batchinfer.operations"))
                 and i != "batchinfer.protocols.base"]
    assert offenders == []


def test_only_the_routes_use_the_operations():
    users = {m for m, imports in _graph().items() if not m.startswith("batchinfer.operations")
             and any(i.startswith("batchinfer.operations") for i in imports)}
    assert users and all(u.startswith("batchinfer.api.") for u in users), users


# The modules the service keeps at its top, shared by its use cases; every other module is in a use case's
# folder, whose `__init__` says what the use case is and what it may touch.
SERVICE_SHARED = {"accounts", "account_waiters", "lifecycle", "limits"}


def test_the_service_is_its_use_cases():
    service = ROOT / PACKAGE / "service"
    assert {p.stem for p in service.glob("*.py")} - {"__init__"} == SERVICE_SHARED
    folders = sorted(p for p in service.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert [f.name for f in folders] == ["background", "creating", "offloading", "reading", "running", "steering"]
    for folder in folders:
        module = ast.parse((folder / "__init__.py").read_text())
        assert ast.get_docstring(module), f"{folder.name} says what its use case is"
        assert not _code_of(folder / "__init__.py"), f"{folder.name}/__init__ holds no code"


def test_the_core_package_has_no_import_circle():
    graph = _graph()
    assert "batchinfer.service.lifecycle" in graph  # the walk found the package
    assert "batchinfer.scheduling.pump" in graph
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_no_module_imports_a_layer_above_its_own():
    upward = [f"{m} (layer {_layer(m)}) imports {i} (layer {_layer(i)})"
              for m, imports in _graph().items() for i in imports if _layer(i) > _layer(m)]
    assert upward == []


@pytest.mark.parametrize(("graph", "circle"), [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
])
def test_the_check_finds_a_circle(graph, circle):
    assert _cycle(graph) == circle


# The one module outside storage/ that may import boto3: the Amazon Bedrock backend kind. Bedrock is a model
# backend like the HTTP ones (its calls are attempts with the same retries, budgets and costs), reached only
# through the AWS SDK's SigV4 signing with the function's role; it stays in providers/ with the other kinds.
BOTO3_OUTSIDE_STORAGE = {f"{PACKAGE}.providers.bedrock"}


def test_only_storage_touches_boto3_and_only_providers_touch_httpx():
    offenders = []
    for path in (ROOT / PACKAGE).rglob("*.py"):
        name = _module_name(path)
        tree = ast.parse(path.read_text())
        modules = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        modules |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        if modules & {"boto3", "botocore"} and not name.startswith(f"{PACKAGE}.storage") and (
                name not in BOTO3_OUTSIDE_STORAGE):
            offenders.append(f"{name} imports boto3")
        # batchctl's user commands are a client of the service's own HTTP API, not part of the service.
        if "httpx" in modules and not name.startswith((f"{PACKAGE}.providers", f"{PACKAGE}.cli.api_client")):
            offenders.append(f"{name} imports httpx")
    assert offenders == []


def test_the_scheduler_sits_between_the_ledger_and_the_service():
    assert (_layer("batchinfer.ledger") < _layer("batchinfer.scheduling.pump")
            < _layer("batchinfer.service.running.run_request"))


def test_the_boto3_allowance_names_an_existing_module_and_nothing_else_in_providers():
    """The allowance is one module: a rename must carry it, and no other provider may lean on it."""
    graph = _graph()
    assert BOTO3_OUTSIDE_STORAGE <= set(graph)
    users = []
    for path in (ROOT / PACKAGE / "providers").rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        if names & {"boto3", "botocore"}:
            users.append(_module_name(path))
    assert users == sorted(BOTO3_OUTSIDE_STORAGE)

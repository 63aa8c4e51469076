"""Every public signature of keras_attn, export and serving is typed (`make test` runs mypy on
them): each parameter but `self`/`cls`, and the return. FastAPI reads a route's annotations
at run time, so routes keep the ones they were written with."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FASTAPI_DECORATORS = {"get", "post", "put", "delete", "api_route", "middleware",
                      "exception_handler"}  # fmt: skip


def _is_route(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and target.attr in FASTAPI_DECORATORS:
            return True
    return False


def untyped(source: str, where: str = "") -> list[str]:
    """`where:line name` of each public def in `source` missing an annotation."""
    missing = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if node.name.startswith("_") and node.name not in ("__init__", "__call__"):
            continue
        if _is_route(node):
            continue
        arguments = node.args
        parameters = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
        parameters += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
        bare = [a.arg for a in parameters if a.annotation is None and a.arg not in ("self", "cls")]
        if bare or node.returns is None:
            missing.append(f"{where}:{node.lineno} {node.name}")
    return missing


def test_the_check_finds_what_is_missing():
    source = (
        "def typed(a: int, *rest: int, **kw: str) -> int: ...\n"
        "def no_return(a: int): ...\n"
        "def bare(a) -> None: ...\n"
        "def _private(a): ...\n"
        "class C:\n"
        "    def __init__(self, x): ...\n"
        "    @app.get('/x')\n"
        "    def route(self, request): ...\n"
    )
    assert [m.split(" ")[1] for m in untyped(source)] == ["no_return", "bare", "__init__"]


def test_every_public_signature_is_typed():
    missing = []
    for folder in ("keras_attn", "export", "serving"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            missing += untyped(path.read_text(encoding="utf-8"), where)
    assert not missing, f"{len(missing)} public defs lack annotations: {missing[:20]}"

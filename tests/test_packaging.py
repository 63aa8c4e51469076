"""The dependency lines between the three import packages, checked in fresh processes, and the
install layout that keeps their names from being shadowed."""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"keras_attn": "keras_attn", "keras_attn_export": "export",
           "keras_attn_serving": "serving"}  # fmt: skip


def modules(package):
    folder = ROOT / FOLDERS[package]
    names = []
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(folder).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        names.append(".".join((package, *parts)))
    return names


def imported_after(names, cwd=None):
    """The top-level packages in `sys.modules` after importing `names` in a fresh process."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {names!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_pyproject_lists_every_package():
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {name for name in modules("keras_attn") if (ROOT / "keras_attn").joinpath(
        *name.split(".")[1:], "__init__.py").is_file()}  # fmt: skip
    assert found | {"keras_attn_export", "keras_attn_serving"} == set(listed["packages"])
    assert listed["package-dir"] == {"keras_attn_export": "export",
                                     "keras_attn_serving": "serving"}  # fmt: skip


def test_serving_never_imports_tensorflow_keras_or_the_library():
    loaded = imported_after(modules("keras_attn_serving"))
    assert not loaded & {"tensorflow", "keras", "keras_attn", "keras_attn_export", "tf2onnx"}


def test_the_manifest_schema_is_a_leaf():
    """Export writes it, serving reads it: it needs neither onnxruntime nor tokenizers."""
    loaded = imported_after(["keras_attn_serving.manifest"])
    assert not loaded & {"onnxruntime", "tokenizers", "tensorflow", "keras", "fastapi", "numpy"}


def test_the_decoding_loop_is_a_leaf():
    """Export checks its decode graphs with the server's own loop: NumPy only."""
    loaded = imported_after(["keras_attn_serving.generation"])
    assert not loaded & {"onnxruntime", "tokenizers", "tensorflow", "keras", "fastapi"}


def test_beam_search_and_the_encoder_decoder_runner_are_leaves():
    """Keras and `/generate` run one beam search; export checks its graphs with the server's
    encoder-decoder runner: NumPy at import (onnxruntime only when a runner is built)."""
    loaded = imported_after(["keras_attn_serving.beam", "keras_attn_serving.seq2seq"])
    assert not loaded & {"onnxruntime", "tokenizers", "tensorflow", "keras", "fastapi"}


def test_the_samplers_are_a_leaf():
    """Keras decoding and `/generate` draw with one module, so it needs NumPy only."""
    loaded = imported_after(["keras_attn_serving.sampling"])
    assert not loaded & {"onnxruntime", "tokenizers", "tensorflow", "keras", "fastapi"}
    assert "numpy" in loaded


def test_the_chat_templates_are_a_leaf():
    """Keras, the export and the server render conversations with one module: Jinja2 only."""
    loaded = imported_after(["keras_attn_serving.chat_template"])
    assert not loaded & {"onnxruntime", "tokenizers", "tensorflow", "keras", "fastapi", "numpy"}
    assert "jinja2" in loaded


@pytest.mark.slow
def test_library_and_export_stay_on_their_side():
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules('keras_attn')!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('keras_attn_')\n"
        "                        or m.split('.')[0] in ('onnxruntime', 'fastapi'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    # The library draws with serving's samplers and beam search (NumPy leaves) and renders
    # chats with its templates, and nothing else of serving's.
    crossing = json.loads(done.stdout.strip().splitlines()[-1])
    assert crossing == [
        "keras_attn_serving",
        "keras_attn_serving.beam",
        "keras_attn_serving.chat_template",
        "keras_attn_serving.sampling",
    ]
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules('keras_attn_export')!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('keras_attn_serving'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    # What crosses from export to serving: the manifest schema (two modules), the decoding
    # loop, the encoder-decoder runner and (through the library) the samplers, all leaves.
    crossing = json.loads(done.stdout.strip().splitlines()[-1])
    assert crossing == [
        "keras_attn_serving",
        "keras_attn_serving.beam",
        "keras_attn_serving.chat_template",
        "keras_attn_serving.generation",
        "keras_attn_serving.manifest",
        "keras_attn_serving.manifest_quantization",
        "keras_attn_serving.sampling",
        "keras_attn_serving.seq2seq",
    ]


def test_a_user_file_named_export_or_serving_does_not_shadow_ours(tmp_path):
    (tmp_path / "export.py").write_text("raise SystemExit('the user file was imported')\n")
    (tmp_path / "serving.py").write_text("raise SystemExit('the user file was imported')\n")
    loaded = imported_after(["keras_attn_serving.manifest", "keras_attn_export.cli"], tmp_path)
    assert {"keras_attn_serving", "keras_attn_export"} <= loaded
    assert not loaded & {"export", "serving"}


def imports_of(package):
    """`{module: {(imported module, deferred)}}` of every module of `package`, from its source:
    every import statement, at module level or inside a function (deferred), resolved to
    names."""
    import ast

    found = {}
    for name in modules(package):
        parts = name.split(".")[1:]
        folder = ROOT / FOLDERS[package]
        path = folder.joinpath(*parts, "__init__.py")
        if not path.is_file():
            path = folder.joinpath(*parts[:-1], parts[-1] + ".py") if parts else path
        targets = set()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module_level = {id(node) for node in tree.body}
        # `if TYPE_CHECKING:` imports are for annotations: never run, neither edge nor deferral.
        typing_only = {id(inner) for node in tree.body if isinstance(node, ast.If)
                       and ast.unparse(node.test).endswith("TYPE_CHECKING")
                       for inner in ast.walk(node)}  # fmt: skip
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            deferred = id(node) not in module_level
            if isinstance(node, ast.Import):
                targets |= {(alias.name, deferred) for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                # `from a.b import c` imports `a.b.c` when that is a module, else `a.b`: the
                # longest known module prefix of `a.b.c` (resolved by the caller).
                targets |= {(f"{node.module}.{alias.name}", deferred) for alias in node.names}
        found[name] = targets
    return found


def unit(module):
    """The node of the import graph a module belongs to: a subpackage of `keras_attn`
    (`keras_attn.models`), or a module of export and serving."""
    parts = module.split(".")
    if parts[0] == "keras_attn":
        return ".".join(parts[:2])
    return module


OURS = tuple(FOLDERS)
# What may cross between the packages, at module level only: export builds on keras_attn, and
# reads serving's manifest schema and decoding loop; keras_attn's decoding draws with serving's
# samplers, so one seed gives the same ids in Keras and over HTTP (three NumPy-only leaves).
SERVING_LEAVES = {
    "keras_attn_serving.beam",
    "keras_attn_serving.chat_template",
    "keras_attn_serving.manifest",
    "keras_attn_serving.generation",
    "keras_attn_serving.sampling",
    "keras_attn_serving.seq2seq",
}


def test_no_import_circle_and_no_deferred_crossing():
    """Every import, deferred (function-level) ones included: the units form no circle, and
    nothing crosses between keras_attn, export and serving but what `SERVING_LEAVES` names."""
    graph, known = {}, [m for p in OURS for m in modules(p)]
    for package in OURS:
        for module, targets in imports_of(package).items():
            for target, deferred in targets:
                top = target.split(".")[0]
                if top not in OURS:
                    continue
                resolved = max((m for m in known if target == m or target.startswith(m + ".")),
                               key=len, default=None)  # fmt: skip
                if resolved is None:
                    continue
                if top != package:
                    allowed = resolved in SERVING_LEAVES or (
                        package == "keras_attn_export" and top == "keras_attn"
                    )
                    assert allowed, f"{module} imports {resolved}"
                    assert not deferred, f"{module} imports {resolved} inside a function"
                if unit(resolved) != unit(module):
                    graph.setdefault(unit(module), set()).add(unit(resolved))
    # A circle is a unit that reaches itself.
    for start in graph:
        seen, stack = set(), list(graph[start])
        while stack:
            node = stack.pop()
            assert node != start, f"import circle through {start}: {sorted(graph[start])}"
            if node not in seen:
                seen.add(node)
                stack.extend(graph.get(node, ()))

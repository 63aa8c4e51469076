"""A Triton Inference Server model from an exported artifact: `NAME/config.pbtxt` beside
`NAME/VERSION/model.onnx`, for Triton's onnxruntime backend.

The same graph `keras-attn-serve` runs, with the inputs and outputs its manifest names: Triton
batches along the leading `batch` axis (`max_batch_size`, its dynamic batcher on), every other
axis keeps its size or is `-1` where the manifest names it (`sequence`). Triton's dynamic
batcher merges only requests of equal shapes: requests of different lengths run apart unless
the client pads them. The ONNX files are
copied after their sha256 is checked against the manifest. Decode graphs and the strings-in
graph (onnxruntime-extensions' custom operators) are not part of it: Triton runs the ids-in
model only.

    from keras_attn_export.triton import write_triton_model
    write_triton_model("artifacts/minilm", "triton_repository", name="minilm")

or `python -m keras_attn_export.triton artifacts/minilm triton_repository --name minilm`.
"""

import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any

# manifest dtype -> Triton's `DataType` (model_config.proto)
TRITON_TYPES = {
    "bool": "TYPE_BOOL",
    "uint8": "TYPE_UINT8",
    "int8": "TYPE_INT8",
    "int16": "TYPE_INT16",
    "int32": "TYPE_INT32",
    "int64": "TYPE_INT64",
    "float16": "TYPE_FP16",
    "float32": "TYPE_FP32",
    "float64": "TYPE_FP64",
    "string": "TYPE_STRING",
}
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def triton_config(manifest: dict[str, Any], name: str, max_batch_size: int = 32,
                  max_queue_delay_us: int = 0, instances: int = 1) -> str:  # fmt: skip
    """The `config.pbtxt` text for an artifact's `manifest.json` (a dict).

    Args:
        manifest: the artifact's manifest.
        name: the model's name in the Triton repository.
        max_batch_size: rows Triton merges at most; 0 turns its batching off (and dims then
            include the batch axis). Taken as 0 if some tensor has no leading `batch` axis.
        max_queue_delay_us: how long Triton's dynamic batcher waits for more rows.
        instances: model instances on the CPU (`instance_group`).
    """
    if not NAME.match(name):
        raise ValueError(
            "`name` must be letters, digits, '_', '.' or '-' (128 at most), starting with a "
            f"letter or digit. Received: {name!r}"
        )
    for argument, value in (("max_batch_size", max_batch_size),
                            ("max_queue_delay_us", max_queue_delay_us)):  # fmt: skip
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"`{argument}` must be an integer >= 0. Received: {value!r}")
    if not isinstance(instances, int) or isinstance(instances, bool) or instances < 1:
        raise ValueError(f"`instances` must be an integer >= 1. Received: {instances!r}")
    onnx = manifest.get("onnx")
    if not onnx:
        raise ValueError("the artifact has no ONNX graph (exported with formats=['saved_model'])")
    tensors = [*manifest["inputs"], *manifest["outputs"]]
    batched = max_batch_size > 0 and all(t["shape"][:1] == ["batch"] for t in tensors)
    lines = [f'name: "{name}"', 'backend: "onnxruntime"',
             f"max_batch_size: {max_batch_size if batched else 0}"]  # fmt: skip
    if onnx["file"] != "model.onnx":
        lines.append(f'default_model_filename: "{onnx["file"]}"')
    for kind, specs in (("input", manifest["inputs"]), ("output", manifest["outputs"])):
        for spec in specs:
            if spec["dtype"] not in TRITON_TYPES:
                raise ValueError(
                    f"{kind} `{spec['name']}` has dtype {spec['dtype']}, which Triton has no "
                    "type for"
                )
            shape = spec["shape"][1:] if batched else spec["shape"]
            dims = ", ".join(str(d) if isinstance(d, int) else "-1" for d in shape)
            # Triton needs at least one dim: a tensor that is only the batch axis (a score
            # per row) is declared [1] and reshaped to [] for the model.
            entry = [f"    dims: [ {dims} ]"]
            if not shape:
                entry = ["    dims: [ 1 ]", "    reshape { shape: [ ] }"]
            lines += [f"{kind} [", "  {", f'    name: "{spec["name"]}"',
                      f"    data_type: {TRITON_TYPES[spec['dtype']]}", *entry, "  }",
                      "]"]  # fmt: skip
    if batched:
        lines += ["dynamic_batching {", f"  max_queue_delay_microseconds: {max_queue_delay_us}",
                  "}"]  # fmt: skip
    lines += ["instance_group [", "  {", f"    count: {instances}", "    kind: KIND_CPU", "  }",
              "]"]  # fmt: skip
    return "\n".join(lines) + "\n"


def write_triton_model(artifact: str | Path, repository: str | Path, name: str | None = None,
                       version: int = 1, **options: Any) -> Path:  # fmt: skip
    """Writes `repository/name/config.pbtxt` and `repository/name/version/` (the artifact's
    ONNX files, sha256 checked). `options` go to `triton_config`. Returns the model folder.

    Args:
        artifact: a folder `export_model` wrote.
        repository: a Triton model repository (created if missing).
        name: the model's name there; default: the artifact folder's name.
        version: the version folder, an integer >= 1.
    """
    artifact = Path(artifact)
    manifest_path = artifact / "manifest.json"
    if not manifest_path.is_file():
        raise ValueError(f"`artifact` must be a folder `export_model` wrote. Received: {artifact}")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"`version` must be an integer >= 1. Received: {version!r}")
    manifest = json.loads(manifest_path.read_text())
    name = name or artifact.resolve().name
    config = triton_config(manifest, name, **options)
    folder = Path(repository) / name
    (folder / str(version)).mkdir(parents=True, exist_ok=True)
    # The served graph and its external data, if any (not the other graphs `files` lists).
    graph = manifest["onnx"]["file"]
    files = [graph, *(f for f in manifest["onnx"].get("files", []) if not f.endswith(".onnx"))]
    for file in files:
        digest = hashlib.sha256((artifact / file).read_bytes()).hexdigest()
        if digest != manifest["files"].get(file):
            raise ValueError(f"`{file}` does not match its sha256 in the artifact's manifest")
        shutil.copyfile(artifact / file, folder / str(version) / file)
    (folder / "config.pbtxt").write_text(config)
    return folder


def main(argv: list[str] | None = None) -> int:
    """`python -m keras_attn_export.triton ARTIFACT REPOSITORY [--name N] [...]`."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("artifact")
    parser.add_argument("repository")
    parser.add_argument("--name", default=None)
    parser.add_argument("--version", type=int, default=1)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-queue-delay-us", type=int, default=0)
    parser.add_argument("--instances", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        folder = write_triton_model(args.artifact, args.repository, args.name, args.version,
                                    max_batch_size=args.max_batch_size,
                                    max_queue_delay_us=args.max_queue_delay_us,
                                    instances=args.instances)  # fmt: skip
    except (ValueError, OSError) as error:
        print(f"keras_attn_export.triton: {error}", file=sys.stderr)
        return 1
    print(f"wrote {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

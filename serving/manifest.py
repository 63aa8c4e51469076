"""The artifact manifest: the one contract between export and serving.

`keras_attn_export` writes `manifest.json` through `Manifest`; `keras_attn_serving` reads it back
through `read_manifest`. This module is a leaf: it imports pydantic and the standard library only
(no TensorFlow, no Keras, no onnxruntime), so both sides can import it alone.

The manifest is typed and closed: an unknown key, a missing key, a wrong type, NaN or infinity,
or a `format_version` this reader does not know is refused with an `ArtifactError`.
"""

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal, get_args

from keras_attn_serving.manifest_quantization import Drift, Quantization, Strict, WeightOnlyInfo
from pydantic import Field, ValidationError

MANIFEST = "manifest.json"
# 2: int8 weights chosen by measurement. 3: `decoding.pad_id` is None where no id is padding,
# and `decode_gqa.onnx` takes a per-row `index`. 4: `onnx.unpadded`, and `onnx.file` is the
# fused graph when there is one. 5: one name for the padding id, `pad_token_id` (as the
# library's models call it): `decoding.pad_id`, `seq2seq.source_pad_id` and
# `onnx.unpadded.*.pad_value` before; `seq2seq.pad_id` is `seq2seq.never_generated_id`; and
# an encoder-decoder's `decode.onnx` takes one `index` per row (older scalar ones still run).
# Formats 2 to 4 are still read (`_renamed`). 6: `decoding.gqa.external_data`, the file
# beside a decode graph that holds its weights; and `decoding` with no `onnx` is an artifact
# for generation only (`export_model(..., formats=["generation"])`). 7:
# `decoding.gqa.weights`, a decode graph whose weights are 4- or 8-bit integers. 8:
# `decoding.gqa.weights.prefill`, that graph's twin at the accuracy level faster for prompts.
# 9: `onnx.qkv_switch`, a padding-free graph that also projects q, k and v on real tokens
# where a batch is mostly padding.
FORMAT_VERSION = 9
READABLE_VERSIONS = (2, 3, 4, 5, 6, 7, 8, 9)
Task = Literal["classify", "tag", "embed", "generate", "span_qa", "multiple_choice",
               "pretraining", "seq2seq"]  # fmt: skip
TASKS = get_args(Task)
# What `WordPieceTextTokenizer.from_folder` reads from the manifest's `tokenizer` folder.
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")


class ArtifactError(ValueError):
    """An artifact folder is missing files, or a file does not match its manifest hash."""


class TensorSpec(Strict):
    name: str
    dtype: str
    shape: list[int | str | None]


class PackerSpec(Strict):
    type: Literal["segment", "start_end"]
    sequence_length: int
    start_value: int | None
    end_value: int | None
    pad_value: int | None
    # How a segment packer shortens a pair that does not fit (absent before pairs were served).
    truncate: Literal["round_robin", "longest_first", "waterfall"] | None = None


class EmbeddingSpec(Strict):
    """How `/embed` pools by default: the checkpoint's own sentence-transformers pooling."""

    pooling: Literal["mean", "cls"]
    normalize: bool


class PaddingRule(Strict):
    """Where a graph that skips padding finds it: positions where `input` is `pad_token_id`,
    but for each row's first; `outputs` (one value per position) are zero there."""

    input: str
    pad_token_id: int
    outputs: list[str]


class QkvTiming(Strict):
    padding: float  # the share of the timed batch that is padding
    packed_ms: float
    unpadded_ms: float


class QkvSwitch(Strict):
    """A graph that projects q, k and v on real tokens alone where more than `threshold` of
    a batch is padding, and packed otherwise (`keras_attn_export.qkv_switch`)."""

    threshold: float
    chosen_by: Literal["measurement"]
    timings: list[QkvTiming]
    unpadded_fused_ops: dict[str, int]  # `fused_ops` counts the packed branch


class OnnxInfo(Strict):
    file: str  # the graph the server runs: the fused one when the export wrote it
    opset: int
    files: list[str]
    fused_ops: dict[str, dict[str, int]]
    # Files whose per-position work runs on real tokens only; outputs there are zero at
    # padding (format 4; absent before).
    unpadded: dict[str, PaddingRule] = Field(default_factory=dict)
    qkv_switch: dict[str, QkvSwitch] = Field(default_factory=dict)  # format 9


class SavedModelInfo(Strict):
    folder: str
    signatures: list[str]


class Parity(Strict):
    tolerance: float
    max_abs_diff: float
    rows: list[dict[str, float | int | str]]
    serve_text_vs_serving_default: float | None = None


class CacheGraph(Strict):
    """A decode graph and the shape of its key/value cache."""

    file: str | None
    layers: int | None = None
    kv_heads: int | None = None
    key_dim: int | None = None
    max_length: int | None = None
    opset: int | None = None
    step_logits_max_abs_diff: float | None = None
    greedy_equals_keras: bool | None = None
    unsupported: str | None = None


class GqaGraph(CacheGraph):
    """`decode_gqa.onnx`, and the file beside it that holds its weights past 64 MiB (ONNX
    external data). With `weights` (format 7), `file` is the weight-only quantized graph
    (`decode_gqa.int4.onnx`); `step_logits_max_abs_diff` and `greedy_equals_keras` are then
    its float32 twin's (the same builder, checked before quantizing and not kept)."""

    external_data: str | None = None
    weights: WeightOnlyInfo | None = None


class Decoding(CacheGraph):
    gqa: GqaGraph | None = None
    # The id that pads the decoding buffer and is never generated: 0, or None where id 0 is a
    # real token (GPT-2, Llama): no id is padding and every id can be generated, as in Keras
    # `generate()`. (Format 2 wrote the last id here instead, and Keras never generated it.)
    pad_token_id: int | None = 0


class Seq2SeqGraphs(CacheGraph):
    """An encoder-decoder's generation graphs: `encoder_file` (source ids to every decoder
    block's cross-attention keys and values, `(batch, layers, 2, S, kv_heads, key_dim)`)
    and `file`, the decoder step over the self-attention cache (the decoder-only graphs'
    layout) and that cross-attention cache."""

    encoder_file: str
    pad_token_id: int  # pads the sources of a batch (the encoder masks it)
    # The id never generated (`Decoding.pad_token_id`'s role): None for the pretrained
    # families, whose decoder start id may be the padding id and which may generate it, but
    # Marian's, whose checkpoints ban their padding id.
    never_generated_id: int | None
    decoder_start_id: int | None  # None: the model names none (one trained from scratch)
    # The only id a generation's last step may choose (BART's and Marian's end id); None:
    # any id (and artifacts exported before it was written).
    forced_eos_token_id: int | None = None
    # The only id its first step may choose (`bart-large-cnn`'s 0); None: any id (and
    # artifacts exported before it was written).
    forced_bos_token_id: int | None = None


class ChatSpec(Strict):
    """How a chat model is prompted and when its turn ends: the chat template (a file of
    the artifact, hashed like the others), the named special tokens it sees, and the ids
    that end a generation unless a request says otherwise."""

    template: str | None = None
    special_tokens: dict[str, str] = Field(default_factory=dict)
    end_token_ids: list[int] = Field(default_factory=list)


class TextOnnx(Strict):
    file: str
    input: str
    max_abs_diff: float
    custom_ops: str


class Manifest(Strict):
    format_version: int
    created: str
    model_name: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    task: Task | None
    labels: list[str] | None
    packer: PackerSpec | None
    embedding: EmbeddingSpec | None = None
    onnx: OnnxInfo | None
    saved_model: SavedModelInfo | None
    tokenizer: str | None
    max_sequence_length: int | None
    vocabulary_size: int | None
    input_ranges: dict[str, tuple[int, int]]
    versions: dict[str, str]
    parity: Parity
    int8: dict[str, Drift] | None
    quantization: Quantization | None = None  # absent in manifests before int8 was chosen
    decoding: Decoding | None
    text_onnx: TextOnnx | None
    files: dict[str, str]
    chat: ChatSpec | None = None  # absent before chat models were exported
    seq2seq: Seq2SeqGraphs | None = None  # absent before encoder-decoders were exported

    def to_json(self) -> str:
        """Strict JSON (no NaN), keys in field order, two-space indents."""
        return json.dumps(self.model_dump(mode="json"), indent=2, allow_nan=False)

    def tokenizer_files(self) -> list[str]:
        """The files a reader opens in the `tokenizer` folder (none without a tokenizer)."""
        if self.tokenizer is None:
            return []
        return [f"{self.tokenizer}/{name}" for name in TOKENIZER_FILES]

    def referenced_files(self) -> list[str]:
        """The files this manifest tells a reader to open (ONNX graphs, decode graphs,
        tokenizer files)."""
        names: list[str | None] = []
        if self.onnx is not None:
            names += [self.onnx.file, *self.onnx.files]
        if self.decoding is not None:
            names.append(self.decoding.file)
            if self.decoding.gqa is not None:
                gqa = self.decoding.gqa
                names += [gqa.file, gqa.external_data]
                if gqa.weights is not None and gqa.weights.prefill is not None:
                    names.append(gqa.weights.prefill.file)
        if self.text_onnx is not None:
            names.append(self.text_onnx.file)
        if self.chat is not None:
            names.append(self.chat.template)
        if self.seq2seq is not None:
            names += [self.seq2seq.encoder_file, self.seq2seq.file]
        names += self.tokenizer_files()
        return list(dict.fromkeys(name for name in names if name))


def parse_manifest(content: dict[str, Any]) -> Manifest:
    """`content` checked against the schema; `ArtifactError` names the first wrong field."""
    version = content.get("format_version") if isinstance(content, dict) else None
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise ArtifactError(
            f"{MANIFEST} has format_version {version!r}; this reader knows "
            f"{', '.join(map(str, READABLE_VERSIONS))}"
        )
    try:
        return Manifest.model_validate(_renamed(content) if version < 5 else content)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise ArtifactError(f"{MANIFEST} field {where!r}: {first['msg']}") from None


# Format 4's names of the padding id (and of the id never generated) and format 5's.
RENAMED = {
    "decoding": {"pad_id": "pad_token_id"},
    "seq2seq": {"source_pad_id": "pad_token_id", "pad_id": "never_generated_id"},
}


def _renamed(content: dict[str, Any]) -> dict[str, Any]:
    """A manifest of formats 2 to 4 under format 5's names (a key that is not there, or an
    entry that is not an object, is left for the schema to name)."""

    def rename(entry: Any, names: dict[str, str], where: str) -> Any:
        if not isinstance(entry, dict):
            return entry
        for old, new in names.items():
            if old in entry and new in entry:  # one value, not whichever comes last
                raise ArtifactError(
                    f"{MANIFEST} field '{where}' holds both {old!r} and {new!r}: format "
                    f"{content.get('format_version')} names it {old!r} only"
                )
        return {names.get(key, key): value for key, value in entry.items()}

    content = {key: rename(value, RENAMED.get(key, {}), key) for key, value in content.items()}
    onnx = content.get("onnx")
    if isinstance(onnx, dict) and isinstance(onnx.get("unpadded"), dict):
        rules = {name: rename(rule, {"pad_value": "pad_token_id"}, f"onnx.unpadded.{name}")
                 for name, rule in onnx["unpadded"].items()}  # fmt: skip
        content["onnx"] = {**onnx, "unpadded": rules}
    return content


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(folder: str | Path) -> Manifest:
    """The folder's manifest, checked against the schema, its `tokenizer` folder inside the
    artifact folder. `verify_files` then checks the bytes."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise ArtifactError(f"no {MANIFEST} in {folder}: not an exported artifact folder")
    try:
        with open(path, encoding="utf-8") as f:
            content = json.load(f, parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError) as error:
        raise ArtifactError(f"{MANIFEST} is not strict JSON: {error}") from None
    manifest = parse_manifest(content)
    _check_tokenizer(Path(folder), manifest)
    for name in manifest.referenced_files():  # checked even where the hashes are not
        if not _plain_name(name):
            raise ArtifactError(
                f"{MANIFEST} points to {name[:80]!r}: not a plain name inside the folder"
            )
    return manifest


def _check_tokenizer(folder: Path, manifest: Manifest) -> None:
    """`tokenizer` names a folder inside `folder`, symbolic links followed: the server reads
    it even when `verify_files` is off. Messages quote the manifest, never a server path."""
    name = manifest.tokenizer
    if name is None:
        return
    field = f"{MANIFEST} field 'tokenizer' is {name[:80]!r}"
    if not _plain_name(name):
        raise ArtifactError(f"{field}: not a plain relative name inside the artifact folder")
    root = folder.resolve()
    for path in [folder / name, *(folder / rel for rel in manifest.tokenizer_files())]:
        if not path.resolve().is_relative_to(root):
            raise ArtifactError(f"{field}: a symbolic link there leads outside the artifact folder")
    if not (folder / name).is_dir():
        raise ArtifactError(f"{field}: no such folder in the artifact folder")


def _refuse_constant(name):
    raise ValueError(f"{name} is not JSON")


def _plain_name(rel) -> bool:
    """A relative POSIX path inside the folder: no `..`, no absolute path, no backslash."""
    if not isinstance(rel, str) or not rel or "\\" in rel or rel.startswith("/"):
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def verify_files(folder: str | Path, manifest: Manifest, prefixes: Iterable[str] = ("",)) -> None:
    """The folder is exactly what the manifest lists, byte for byte: every listed file under
    one of `prefixes` matches its sha256, no file is there unlisted, every path is a plain
    name inside the folder, and every file the manifest points to is listed."""
    folder = Path(folder)
    files = manifest.files
    if not files:
        raise ArtifactError(f"{MANIFEST} lists no files")
    referenced = manifest.referenced_files()
    for rel in [*files, *referenced]:
        if not _plain_name(rel):
            raise ArtifactError(
                f"{MANIFEST} names {str(rel)[:80]!r}: not a plain name inside the folder"
            )
    on_disk = {
        path.relative_to(folder).as_posix()
        for path in folder.rglob("*")
        if path.is_file() or path.is_symlink()
    } - {MANIFEST}
    tokenizer = f"{manifest.tokenizer}/" if manifest.tokenizer else None
    if tokenizer is not None:
        in_tokenizer = {rel for rel in on_disk if rel.startswith(tokenizer)}
        unhashed = sorted((set(manifest.tokenizer_files()) | in_tokenizer) - set(files))
        if unhashed:
            raise ArtifactError(
                f"{MANIFEST} field 'tokenizer' names {manifest.tokenizer!r}, whose files "
                f"{unhashed[:5]} are not in {MANIFEST} 'files' with a sha256"
            )
    unlisted = [rel for rel in referenced if rel not in files]
    if unlisted:
        raise ArtifactError(f"{MANIFEST} points to {unlisted} but does not list their sha256")
    unknown = sorted(rel for rel in on_disk - set(files) if rel.startswith(tuple(prefixes)))
    if unknown:
        raise ArtifactError(f"{unknown[:5]} are in the folder but not in {MANIFEST}")
    for rel, expected in files.items():
        if not rel.startswith(tuple(prefixes)):
            continue
        path = folder / rel
        owner = " (field 'tokenizer')" if tokenizer and rel.startswith(tokenizer) else ""
        if path.is_symlink() or not path.is_file():
            raise ArtifactError(f"{rel}{owner} is listed in {MANIFEST} but missing from the folder")
        if sha256(path) != expected:
            raise ArtifactError(f"{rel}{owner} does not match its sha256 in {MANIFEST}")

"""Decoding (NumPy only), greedy or sampled, one loop for every way of computing the next
logits: an exported decode graph with a key/value cache (`decode.onnx`), or any full-prefix
`logits_fn(token_ids) -> logits` (recomputing the prefix every step)."""

import mmap
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from keras_attn_serving.sampling import force_ends

if TYPE_CHECKING:
    import onnxruntime as ort
    from numpy.typing import ArrayLike

# `step(token_ids, state, index) -> (last logits (batch, vocab), state)`: see `decode_ids`
# (an onnxruntime session's step returns the pair as the list `session.run` gives).
Step = Callable[[np.ndarray, Any, int], tuple[np.ndarray, Any] | list[np.ndarray]]
# `sampler(logits (batch, vocab) float64) -> ids (batch,)`: a `sampling.Sampler`.
Chooser = Callable[[np.ndarray], np.ndarray]


def decode_ids(step: Step, state: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int,
               stop_token_ids: Iterable[int] = (), pad_token_id: int | None = 0,
               max_length: int | None = None, sampler: Chooser | None = None,
               forced_eos_token_id: int | None = None,
               forced_bos_token_id: int | None = None) -> list[list[int]]:  # fmt: skip
    """Extends each prompt one token at a time: the most likely token, or `sampler`'s choice.

    `step(token_ids, state, index) -> (last_logits (batch, vocab), state)` runs new tokens
    placed at `index`. Prompts of different lengths share a right-padded buffer: the
    shortest prompt's length is prefilled for every row, then each step writes one position
    for all rows (rows still inside their prompt keep the prompt's token). The padding id is
    never generated; `pad_token_id=None` (a model that reads id 0 as a token) bans no id. A row
    ends at its first stop token, which is not returned (the contract of
    `keras_attn.models.generate`: the same ids in Keras, in the export and over HTTP).
    `sampler` (a `keras_attn_serving.sampling.Sampler`) is called once per step on every
    row's logits, as Keras-side `decode` calls it: the same seed draws the same ids.
    `forced_eos_token_id`: the only id a row's last step (its `max_new_tokens`-th id) may
    choose (`transformers`' rule of the same name); `forced_bos_token_id`: the only first
    new id of a one-id prompt (an encoder-decoder's start id; `sampling.force_ends`).

    Returns:
        list of lists: the new ids of each prompt.
    """
    new: list[list[int]] = [[] for _ in prompts]
    for row, token in decode_tokens(step, state, prompts, max_new_tokens, stop_token_ids,
                                    pad_token_id, max_length, sampler,
                                    forced_eos_token_id, forced_bos_token_id):  # fmt: skip
        new[row].append(token)
    return new


def decode_tokens(step: Step, state: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                  stop_token_ids: Iterable[int] = (), pad_token_id: int | None = 0,
                  max_length: int | None = None, sampler: Chooser | None = None,
                  forced_eos_token_id: int | None = None,
                  forced_bos_token_id: int | None = None,
                  ) -> Iterator[tuple[int, int]]:  # fmt: skip
    """`decode_ids` as a generator of `(row, new id)`, each as soon as it is chosen (what
    streaming generation sends); a row's ids end before its first stop token."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("`prompts` must be a non-empty list of non-empty id lists.")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"`max_new_tokens` must be >= 0. Received: {max_new_tokens!r}")
    if max_new_tokens == 0:
        return
    lengths = np.array([len(p) for p in prompts])
    total = int(lengths.max()) + max_new_tokens
    if max_length is not None and total > max_length:
        raise ValueError(
            f"prompt length {int(lengths.max())} + max_new_tokens {max_new_tokens} exceeds the "
            f"model's maximum sequence length {max_length}"
        )
    fill = 0 if pad_token_id is None else pad_token_id
    buffer = np.full((len(prompts), total), fill, dtype=np.int32)
    for i, prompt in enumerate(prompts):
        buffer[i, : len(prompt)] = prompt
    stop_ids = np.asarray(sorted(set(int(t) for t in stop_token_ids)), dtype=np.int64)
    done = np.zeros(len(prompts), bool)
    start = int(lengths.min())
    logits, state = step(buffer[:, :start], state, 0)
    for t in range(start, total):
        last = np.asarray(logits, np.float64)
        if pad_token_id is not None:
            last[:, pad_token_id] = -np.inf
        last = force_ends(last, t - lengths, lengths, max_new_tokens, forced_bos_token_id,
                          forced_eos_token_id)  # fmt: skip
        chosen = np.where(done, fill, last.argmax(-1) if sampler is None else sampler(last))
        generated = (t >= lengths) & (t < lengths + max_new_tokens)
        buffer[:, t] = np.where(t >= lengths, chosen, buffer[:, t])
        stopped = generated & np.isin(chosen, stop_ids)
        for row in np.flatnonzero(generated & ~done & ~stopped):
            yield int(row), int(chosen[row])
        done |= stopped | (t + 1 >= lengths + max_new_tokens)
        if done.all() or t == total - 1:
            break
        logits, state = step(buffer[:, t : t + 1], state, t)


def prefix_step(
    logits_fn: Callable[[np.ndarray], "ArrayLike"],
) -> Callable[[np.ndarray, np.ndarray, int], tuple[np.ndarray, np.ndarray]]:
    """A step over a full-prefix `logits_fn` (int32 ids `(batch, length)` → logits
    `(batch, length, vocab)`): its state is the prefix, recomputed every step. Start it
    from `np.zeros((batch, 0), np.int32)`."""

    def step(
        token_ids: np.ndarray, prefix: np.ndarray, index: int
    ) -> tuple[np.ndarray, np.ndarray]:
        prefix = np.concatenate([prefix[:, :index], token_ids], axis=1)
        return np.asarray(logits_fn(prefix))[:, -1], prefix

    return step


def greedy(
    logits_fn: Callable[[np.ndarray], "ArrayLike"],
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    stop_token_ids: Iterable[int] = (),
    pad_token_id: int | None = 0,
    max_length: int | None = None,
) -> list[list[int]]:
    """Greedy `decode_ids` over a full-prefix `logits_fn` (see `prefix_step`)."""
    empty = np.zeros((len(prompts), 0), np.int32)
    return decode_ids(prefix_step(logits_fn), empty, prompts, max_new_tokens,
                         stop_token_ids, pad_token_id, max_length)  # fmt: skip


def session_step(
    session: "ort.InferenceSession",
) -> Callable[[np.ndarray, np.ndarray, int], list[np.ndarray]]:
    """The step function of an exported `decode.onnx` onnxruntime session."""

    def step(token_ids: np.ndarray, cache: np.ndarray, index: int) -> list[np.ndarray]:
        feeds = {"token_ids": np.asarray(token_ids, np.int32), "cache": cache,
                 "index": np.asarray(index, np.int32)}  # fmt: skip
        return session.run(["logits", "updated_cache"], feeds)

    return step


class PrefillTwin(NamedTuple):
    """A decode graph's prefill twin (`prefill_gqa.int4.onnx`: the same graph and weights at
    the accuracy level faster for prompts) and the fewest new tokens a run gives it."""

    session: "ort.InferenceSession"
    min_tokens: int


def load_prefill_twin(
    folder: Any, gqa: dict[str, Any], options: Any, step: "ort.InferenceSession"
) -> PrefillTwin | None:
    """The prefill twin a quantized `gqa` entry names (manifest `decoding.gqa.weights.prefill`),
    as a session in `folder` made with `options`, or None. `ArtifactError` unless it takes
    and gives what the decode graph's session `step` does (names, shapes and types): it
    runs on the same cache buffers."""
    import onnxruntime as ort
    from keras_attn_serving.manifest import ArtifactError

    twin = (gqa.get("weights") or {}).get("prefill")
    if not twin:
        return None
    path = str(folder / twin["file"])
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def signature(s: "ort.InferenceSession") -> list[tuple[str, Any, str]]:
        return [(a.name, a.shape, a.type) for a in [*s.get_inputs(), *s.get_outputs()]]

    if signature(session) != signature(step):
        raise ArtifactError(
            "decoding.gqa.weights.prefill.file: its inputs and outputs are not those of "
            "decoding.gqa.file"
        )
    return PrefillTwin(session, int(twin["min_tokens"]))


class BoundCache:
    """The key/value cache of one generation over `decode_gqa.onnx`, kept in onnxruntime.

    Each block's past and present buffers are one `OrtValue` bound as both input and output,
    so onnxruntime's `GroupQueryAttention` writes the new keys and values in place: no step
    copies the cache in or out of Python. Pass it as the `state` of `gqa_step`'s step. With
    a `prefill` twin, the same buffers are bound to it too, and a run of its `min_tokens`
    new tokens or more goes through it.
    """

    def __init__(self, session: "ort.InferenceSession", spec: dict[str, Any], batch: int,
                 prefill: PrefillTwin | None = None) -> None:  # fmt: skip
        shape = (batch, spec["kv_heads"], spec["max_length"], spec["key_dim"])
        self.arrays = [zeroed(shape) for _ in range(2 * spec["layers"])]
        self.session, self.prefill = session, prefill
        self.written = 0  # positions written: the furthest a run reached
        self.binding, self.buffers = bind_cache(session, self.arrays)
        if prefill is not None:
            self.prefill_binding, values = bind_cache(prefill.session, self.arrays)
            self.buffers += values

    def run(self, token_ids: np.ndarray, index: np.ndarray) -> np.ndarray:
        """The last logits of `token_ids` `(batch, new)` written at `index`."""
        session, binding = self.session, self.binding
        if self.prefill is not None and token_ids.size >= self.prefill.min_tokens:
            session, binding = self.prefill.session, self.prefill_binding
        self.written = max(self.written, int(np.max(index)) + token_ids.shape[1])
        return run_bound(session, binding, token_ids, index)


def run_bound(session: "ort.InferenceSession", binding: Any, token_ids: np.ndarray,
              index: np.ndarray) -> np.ndarray:  # fmt: skip
    """One run of a decode graph over a cache bound by `bind_cache`: its logits."""
    binding.bind_cpu_input("token_ids", np.ascontiguousarray(token_ids, np.int32))
    binding.bind_cpu_input("index", np.ascontiguousarray(index, np.int32))
    session.run_with_iobinding(binding)
    return binding.get_outputs()[0].numpy()


def zeroed(shape: tuple[int, ...]) -> np.ndarray:
    """float32 zeros in a private anonymous mapping of their own (copied on write in a forked
    process), for a key/value cache: the kernel commits its pages as they are first written.
    Not `np.zeros`, which advises huge pages for large arrays: where the kernel compacts
    memory to give them at the first write (transparent_hugepage `defrag` = madvise, a common
    default), the first token in each new cache row stalled 0.4 s (SmolLM2-135M's shape;
    under 1 ms in this mapping)."""
    count = int(np.prod(shape))
    memory = mmap.mmap(-1, max(4 * count, 1), flags=mmap.MAP_PRIVATE)
    return np.frombuffer(memory, np.float32, count=count).reshape(shape)


def bind_cache(session: "ort.InferenceSession", arrays: list[np.ndarray]) -> tuple[Any, list[Any]]:
    """An io binding of `decode_gqa.onnx` whose `past_*`/`present_*` of block `n // 2` (key,
    then value) are both `arrays[n]`'s memory (CPU `OrtValue`s share a NumPy array's memory),
    and the `OrtValue`s, which must outlive the binding. `logits` is output 0."""
    import onnxruntime as ort

    binding = session.io_binding()
    binding.bind_output("logits")  # first: `gqa_step` reads output 0
    values = []
    for n, array in enumerate(arrays):
        value = ort.OrtValue.ortvalue_from_numpy(array)
        kind, layer = ("key", "value")[n % 2], n // 2
        binding.bind_ortvalue_input(f"past_{kind}_{layer}", value)
        binding.bind_ortvalue_output(f"present_{kind}_{layer}", value)
        values.append(value)
    return binding, values


def row_buckets(rows: int) -> list[int]:
    """The row counts a shared step runs on, up to `rows`: 1, 2, 4, then every multiple of
    4 (a step's cost follows its rows, not the capacity)."""
    return sorted({min(size, rows) for size in (1, 2, 4, *range(8, rows + 4, 4))})


def bucket_of(buckets: Iterable[int], rows: int) -> int:
    """The smallest of `buckets` that holds `rows` rows."""
    return min(size for size in buckets if size >= rows)


class BucketedCache:
    """The shared cache of iteration-level batching (`batched_generation`): one set of
    per-block key/value buffers `(rows, kv_heads, max_length, key_dim)` in
    NumPy, and an onnxruntime binding per bucket of leading rows (1, 2, 4, then every
    multiple of 4: a 20-row step costs 7.4 ms where 32 rows cost 10.7, toy Llama d512): each
    binds views of the same memory as past and present, so GroupQueryAttention writes in
    place. With a `prefill` twin, each bucket is bound to it too, for runs of its
    `min_tokens` new tokens or more."""

    def __init__(self, session: "ort.InferenceSession", spec: dict[str, Any], rows: int,
                 prefill: PrefillTwin | None = None) -> None:  # fmt: skip
        shape = (rows, spec["kv_heads"], spec["max_length"], spec["key_dim"])
        self.buffers = [zeroed(shape) for _ in range(2 * spec["layers"])]
        self.session, self.prefill = session, prefill
        self.values: list[Any] = []  # the OrtValues must outlive their bindings
        self.bindings = self._bind(session, rows)
        self.prefill_bindings = {} if prefill is None else self._bind(prefill.session, rows)

    def _bind(self, session: "ort.InferenceSession", rows: int) -> dict[int, Any]:
        bindings = {}
        for size in row_buckets(rows):
            binding, values = bind_cache(session, [buffer[:size] for buffer in self.buffers])
            bindings[size] = binding
            self.values += values
        return bindings

    def bucket(self, rows: int) -> int:
        return bucket_of(self.bindings, rows)

    def run(self, rows: int, token_ids: np.ndarray, index: np.ndarray) -> np.ndarray:
        """The last logits of the first `rows` rows (a bucket) taking `token_ids` at
        `index`."""
        if self.prefill is not None and token_ids.size >= self.prefill.min_tokens:
            return run_bound(self.prefill.session, self.prefill_bindings[rows], token_ids, index)
        return run_bound(self.session, self.bindings[rows], token_ids, index)

    def copy_row(self, source: "BucketedCache", source_row: int, row: int, length: int) -> None:
        for mine, theirs in zip(self.buffers, source.buffers, strict=True):
            mine[row, :, :length] = theirs[source_row, :, :length]


def gqa_step(
    session: "ort.InferenceSession",
) -> Callable[[np.ndarray, BoundCache, int], tuple[np.ndarray, BoundCache]]:
    """The step function of an exported `decode_gqa.onnx` session; its state is a
    `BoundCache` (bound to this session, and to its prefill twin if it has one)."""
    # `index` is `(1,)` (or one per row); graphs exported before that took a scalar.
    (index_input,) = [i for i in session.get_inputs() if i.name == "index"]
    index_shape = (1,) if len(index_input.shape) == 1 else ()

    def step(token_ids: np.ndarray, cache: BoundCache, index: int) -> tuple[np.ndarray, BoundCache]:
        return cache.run(np.asarray(token_ids), np.full(index_shape, index, np.int32)), cache

    return step


def empty_cache(spec: dict[str, Any], batch: int) -> np.ndarray:
    """The zero key/value cache an exported decode graph starts from (`spec`: the
    manifest's `decoding` entry)."""
    shape = (batch, spec["layers"], 2, spec["max_length"], spec["kv_heads"], spec["key_dim"])
    return np.zeros(shape, np.float32)

"""Decoding loops: greedy and sampled continuation of a batch, and beam search."""

from collections.abc import Callable, Iterable
from typing import Any

import keras
import numpy as np
from keras import ops

from keras_attn.decoding.beam import ban_ngrams, beam_search, check_beam_arguments
from keras_attn.decoding.runners import Runner, compiled, position
from keras_attn.decoding.samplers import Sampler, force_ends
from keras_attn.types import Tensor

SAMPLERS = ("greedy", "sample", "beam")


def _last_logits(logits, pad_token_id):
    last = ops.convert_to_numpy(logits[:, -1]).astype("float64")
    if pad_token_id is not None:
        last[:, pad_token_id] = -np.inf  # padding is never generated
    return last


def _ends(stop, pad_token_id):
    """The ids that end a row's new ids: the stop ids, and the padding id if there is one."""
    return stop if pad_token_id is None else stop | {pad_token_id}


def _until_stop(ids, stop):
    for n, token in enumerate(ids):
        if token in stop:
            return ids[:n]
    return ids


def as_prompts(prompts: Any) -> list[list[int]]:
    """Prompts as lists of ints, from a list of id lists, a 2-D NumPy array or a 2-D backend
    tensor (Hugging Face's and keras-hub's `(batch, seq)` ids)."""
    if not isinstance(prompts, (list, tuple)):
        array = np.asarray(ops.convert_to_numpy(prompts))
        if array.ndim != 2:
            raise ValueError(
                "`prompts` must be a list of id lists or a 2-D array `(batch, seq)`. "
                f"Received: shape={array.shape}"
            )
        prompts = array.tolist()
    if not prompts or any(not isinstance(p, (list, tuple, np.ndarray)) or len(p) == 0
                          for p in prompts):  # fmt: skip
        raise ValueError(
            "`prompts` must be a non-empty list of non-empty id lists (one per prompt). "
            f"Received: {str(prompts)[:80]}"
        )
    out = []
    for prompt in prompts:
        array = np.asarray(prompt)
        if not np.issubdtype(array.dtype, np.integer):
            raise ValueError(
                f"`prompts` must hold integer ids. Received dtype {array.dtype}: {str(prompt)[:60]}"
            )
        out.append([int(t) for t in array.ravel()])
    return out


def decode(
    runner: Runner,
    prompts: Any,
    max_new_tokens: int,
    sampler: str = "greedy",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    num_beams: int = 4,
    length_penalty: float = 1.0,
    stop_token_ids: Iterable[int] = (),
    seed: int | None = None,
    use_cache: bool = True,
    pad_token_id: int | None = 0,
    early_stopping: bool | str = False,
    no_repeat_ngram_size: int = 0,
    forced_eos_token_id: int | None = None,
    forced_bos_token_id: int | None = None,
) -> list[list[int]]:
    """Continues each prompt by up to `max_new_tokens` ids.

    Greedy and sampled decoding run all prompts in one batch: prompts share a right-padded
    buffer, and step `t` decodes position `t` for every row (rows whose prompt is longer than
    `t` keep their prompt token). A row stops at its first stop token; the loop stops when
    every row has. Beam search runs one prompt at a time with `num_beams` rows.

    Args:
        runner: a `keras_attn.decoding.Runner` (`CausalLM.runner()`, `Seq2Seq.runner(...)`).
        prompts: list of non-empty lists of ids.
        max_new_tokens: int.
        sampler: `"greedy"`, `"sample"` (temperature, top-k, top-p) or `"beam"`.
        temperature, top_k, top_p, seed: see `Sampler`.
        num_beams: int. Beams for `"beam"`. Defaults to `4`.
        length_penalty: float α: a finished beam's score is its summed log-probability over
            `length ** α` (`length`: its new ids, the stop id included), as `transformers`
            scores it. `0` ranks by raw log-probability. Defaults to `1.0`.
        early_stopping: `True`, `False` (the default) or `"never"`: when beam search ends,
            as `transformers` decides it (see `keras_attn.decoding.beam`).
        no_repeat_ngram_size: int. No n-gram of this size occurs twice in a row's ids
            (prompt included). Defaults to `0` (off).
        forced_eos_token_id: int or None. The only id a row's last step (its
            `max_new_tokens`-th id) may choose, as `transformers` forces it (BART's and
            Marian's checkpoints name their end id). Defaults to `None` (off).
        forced_bos_token_id: int or None. The only id the first new id of a row whose
            prompt is one id (an encoder-decoder's start id) may be, as `transformers` forces
            it (`bart-large-cnn` names 0). `forced_eos_token_id` wins where both apply.
            Defaults to `None` (off).
        stop_token_ids: ids that end a sequence; they are not returned.
        use_cache: bool. `False` recomputes the whole prefix every step (the reference).
        pad_token_id: int or None. Padding id, never generated. Defaults to `0`. `None`: no
            id is padding (a model that reads id 0 as a token, `mask_zero=False`), every id
            can be generated, and the buffer's unused places hold id 0.
    Returns:
        list (one per prompt) of lists of new ids.
    """
    prompts = as_prompts(prompts)
    if not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
        raise ValueError(
            f"`max_new_tokens` must be a positive int. Received: max_new_tokens={max_new_tokens!r}"
        )
    if sampler not in SAMPLERS:
        raise ValueError(f"`sampler` must be one of {SAMPLERS}. Received: sampler={sampler!r}")
    if sampler != "sample":  # never silently decoded greedily
        unused = {"temperature": temperature if temperature != 1.0 else None, "top_k": top_k,
                  "top_p": top_p}  # fmt: skip
        unused = {key: value for key, value in unused.items() if value is not None}
        if unused:
            raise ValueError(
                f"{', '.join(f'`{key}`' for key in unused)} only apply with sampler='sample'. "
                f"Received: sampler={sampler!r}, "
                + ", ".join(f"{key}={value!r}" for key, value in unused.items())
            )
    size = getattr(runner, "vocabulary_size", None)
    bad = sorted({int(t) for p in prompts for t in p if size is not None and not 0 <= t < size})
    forced = _forced_id("forced_eos_token_id", forced_eos_token_id, size)
    forced_bos = _forced_id("forced_bos_token_id", forced_bos_token_id, size)
    if bad:
        raise ValueError(
            f"`prompts` hold ids outside the vocabulary [0, {size}). Received: {bad[:5]}"
        )
    longest = max(len(p) for p in prompts)
    limit = getattr(runner, "max_length", None)
    if limit is not None and longest + max_new_tokens > limit:
        raise ValueError(
            f"The longest prompt ({longest} ids) plus `max_new_tokens` ({max_new_tokens}) is "
            f"{longest + max_new_tokens}, past the model's context length {limit} (its position "
            "table). Shorten the prompt or ask for fewer tokens."
        )
    stop = set(int(s) for s in stop_token_ids)
    check_beam_arguments(num_beams, early_stopping, no_repeat_ngram_size)
    if sampler == "beam":
        return [
            beam_search(
                runner,
                row,
                prompt,
                max_new_tokens,
                num_beams,
                length_penalty,
                stop,
                pad_token_id,
                use_cache,
                early_stopping,
                no_repeat_ngram_size,
                forced,
                forced_bos,
            )
            for row, prompt in enumerate(prompts)
        ]
    choose = Sampler(sampler, temperature, top_k, top_p, seed)
    lengths = np.array([len(p) for p in prompts])
    width = int(lengths.max()) + max_new_tokens
    fill = 0 if pad_token_id is None else pad_token_id
    buffer = np.full((len(prompts), width), fill, dtype="int32")
    for row, prompt in enumerate(prompts):
        buffer[row, : len(prompt)] = prompt
    start = int(lengths.min())
    state = runner.initial_state(list(range(len(prompts))), width)
    if use_cache:
        logits, state = runner.compiled_step(buffer[:, :start], state, position(0))
    if use_cache and sampler == "greedy" and hasattr(runner, "model") and not no_repeat_ngram_size:
        # Backend tensors in: PyTorch compares a tensor with a NumPy array by neither rule.
        tensor = ops.convert_to_tensor
        buffer, finished = greedy_loop(runner)(
            tensor(buffer), tensor(lengths.astype("int32")), state, logits[:, -1],
            position(start), tensor(np.asarray(sorted(stop) or [-1], dtype="int32")),
            pad_token_id, forced, forced_bos,
        )  # fmt: skip
        return _new_ids(ops.convert_to_numpy(buffer), ops.convert_to_numpy(finished), lengths,
                        max_new_tokens, _ends(stop, pad_token_id))  # fmt: skip
    if not use_cache:
        logits = runner.compiled_full(buffer[:, :start], state)
    finished = np.zeros(len(prompts), dtype=bool)
    for t in range(start, width):
        last = _last_logits(logits, pad_token_id)
        if no_repeat_ngram_size:
            ban_ngrams(last, [buffer[r, :t].tolist() for r in range(len(prompts))],
                       no_repeat_ngram_size)  # fmt: skip
        # After the n-gram ban, as `transformers` orders its processors: the forced id wins.
        last = force_ends(last, t - lengths, lengths, max_new_tokens, forced_bos, forced)
        chosen = choose(last)
        generated = t >= lengths
        chosen = np.where(finished, fill, chosen)
        buffer[:, t] = np.where(generated, chosen, buffer[:, t])
        finished |= generated & np.isin(chosen, list(stop))
        if finished.all() or t == width - 1:
            break
        if use_cache:
            logits, state = runner.compiled_step(buffer[:, t : t + 1], state, position(t))
        else:
            logits = runner.compiled_full(buffer[:, : t + 1], state)
    return _new_ids(buffer, finished, lengths, max_new_tokens, _ends(stop, pad_token_id))


def _forced_id(name: str, value: Any, size: int | None) -> int | None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0
        or (size is not None and value >= size)
    ):  # fmt: skip
        raise ValueError(
            f"`{name}` must be None or an id of the vocabulary [0, {size}). "
            f"Received: {name}={value!r}"
        )
    return None if value is None else int(value)


def _new_ids(buffer, finished, lengths, max_new_tokens, stop):
    return [
        _until_stop(buffer[row, n : n + max_new_tokens].tolist(), stop)
        if finished[row]
        else buffer[row, n : n + max_new_tokens].tolist()
        for row, n in enumerate(lengths)
    ]


def _is_stop(ids, stop_ids):
    # Not `ops.isin`: on TensorFlow it branches on tensor sizes in Python, which a graph refuses.
    return ops.any(ops.expand_dims(ids, -1) == ops.expand_dims(stop_ids, 0), axis=-1)


def greedy_loop(runner: Runner) -> Callable[..., tuple[Tensor, Tensor]]:
    """Cached greedy decoding as one compiled loop (`ops.while_loop`), built once per model
    (`runner.model`; runners without a model, such as pure-numpy test runners, use the
    Python loop).

    The Python loop of `decode` pays a call into the backend, a device-to-host copy and
    numpy work for every token; here the whole continuation runs in the backend, under XLA
    on TensorFlow. Same rules as `decode`: step `t` writes position `t` of every row whose
    prompt is shorter than `t`; a row stops at its first stop token.

    Returns `fn(buffer, lengths, state, last_logits, t, stop_ids, pad_token_id,
    forced_eos_token_id, forced_bos_token_id) -> (buffer, finished)`, where `state` and
    `last_logits` come from prefilling `buffer[:, :t]`; a row's last step (position
    `length + width - longest - 1`) chooses `forced_eos_token_id` where that is not None, and
    the first new id of a one-id prompt is `forced_bos_token_id` where that is not None.
    """

    def loop(
        buffer: Tensor,
        lengths: Tensor,
        state: Any,
        logits: Tensor,
        t: int | Tensor,
        stop_ids: Tensor,
        pad_token_id: int | None,
        forced_eos_token_id: int | None = None,
        forced_bos_token_id: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        rows, width = buffer.shape
        fill = 0 if pad_token_id is None else pad_token_id
        vocabulary = ops.arange(ops.shape(logits)[-1], dtype="int32")
        # Each row's last step: its length plus the new ids the buffer leaves it, minus one.
        last_step = lengths + (width - ops.max(lengths)) - 1

        def body(
            t: Tensor, buffer: Tensor, state: Any, logits: Tensor, finished: Tensor
        ) -> tuple[Tensor, Tensor, Any, Tensor, Tensor]:
            if pad_token_id is not None:
                logits = ops.where(vocabulary == pad_token_id, float("-inf"), logits)
            # `keras_attn_serving.sampling.force_ends` in the graph: first bos, then eos.
            for forced_id, where in (
                (forced_bos_token_id, ops.logical_and(lengths == 1, t == 1)),
                (forced_eos_token_id, last_step == t),
            ):
                if forced_id is not None:
                    forced = ops.where(vocabulary == forced_id, 0.0, float("-inf"))
                    where = ops.expand_dims(where, 1)
                    logits = ops.where(where, ops.cast(forced, logits.dtype), logits)
            chosen = ops.cast(ops.argmax(logits, axis=-1), "int32")
            chosen = ops.where(finished, fill, chosen)
            current = ops.squeeze(ops.slice(buffer, (0, t), (rows, 1)), 1)
            generated = t >= lengths
            token = ops.where(generated, chosen, current)
            buffer = ops.slice_update(buffer, (0, t), ops.expand_dims(token, 1))
            finished = ops.logical_or(
                finished, ops.logical_and(generated, _is_stop(chosen, stop_ids))
            )
            logits, state = runner.step(ops.expand_dims(token, 1), state, t)
            return t + 1, buffer, state, logits[:, -1], finished

        def more(t: Tensor, buffer: Tensor, state: Any, logits: Tensor, finished: Tensor) -> Tensor:
            return ops.logical_and(t < width, ops.logical_not(ops.all(finished)))

        finished = ops.zeros((rows,), dtype="bool")
        out = ops.while_loop(more, body, (t, buffer, state, logits, finished))
        return out[1], out[4]

    def build() -> Callable[..., tuple[Tensor, Tensor]]:
        if keras.backend.backend() == "jax":
            import jax

            return jax.jit(loop, static_argnums=(6, 7, 8))
        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            return tf.function(loop, jit_compile=True)
        return loop

    return compiled(runner.model, "greedy_loop", build)

"""Decoding loops: greedy and sampled continuation of a batch, and beam search."""

import numpy as np
from keras import ops

from keras_attn.decoding.runners import position, select_rows
from keras_attn.decoding.samplers import Sampler, log_softmax

SAMPLERS = ("greedy", "sample", "beam")


def _last_logits(logits, pad_id):
    last = ops.convert_to_numpy(logits[:, -1]).astype("float64")
    last[:, pad_id] = -np.inf  # padding is never generated
    return last


def _until_stop(ids, stop):
    for n, token in enumerate(ids):
        if token in stop:
            return ids[:n]
    return ids


def generate(
    runner,
    prompts,
    max_new_tokens,
    sampler="greedy",
    temperature=1.0,
    top_k=None,
    top_p=None,
    num_beams=4,
    length_penalty=0.6,
    stop_token_ids=(),
    seed=None,
    use_cache=True,
    pad_id=0,
):
    """Continues each prompt by up to `max_new_tokens` ids.

    Greedy and sampled decoding run all prompts in one batch: prompts share a right-padded
    buffer, and step `t` decodes position `t` for every row (rows whose prompt is longer than
    `t` keep their prompt token). A row stops at its first stop token; the loop stops when
    every row has. Beam search runs one prompt at a time with `num_beams` rows.

    Args:
        runner: a `CausalLMRunner` or `Seq2SeqRunner`.
        prompts: list of non-empty lists of ids.
        max_new_tokens: int.
        sampler: `"greedy"`, `"sample"` (temperature, top-k, top-p) or `"beam"`.
        temperature, top_k, top_p, seed: see `Sampler`.
        num_beams: int. Beams for `"beam"`. Defaults to `4`.
        length_penalty: float α of Wu et al.'s `((5 + n) / 6)^α`; beam scores are summed
            log-probabilities divided by it. `0` ranks by raw log-probability.
        stop_token_ids: ids that end a sequence; they are not returned.
        use_cache: bool. `False` recomputes the whole prefix every step (the reference).
        pad_id: int. Padding id, never generated. Defaults to `0`.
    Returns:
        list (one per prompt) of lists of new ids.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("`prompts` must be a non-empty list of non-empty id lists.")
    if not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
        raise ValueError(
            f"`max_new_tokens` must be a positive int. Received: max_new_tokens={max_new_tokens!r}"
        )
    if sampler not in SAMPLERS:
        raise ValueError(f"`sampler` must be one of {SAMPLERS}. Received: sampler={sampler!r}")
    stop = set(int(s) for s in stop_token_ids)
    if sampler == "beam":
        if not isinstance(num_beams, int) or num_beams <= 0:
            raise ValueError(
                f"`num_beams` must be a positive int. Received: num_beams={num_beams!r}"
            )
        return [
            beam_search(
                runner,
                row,
                prompt,
                max_new_tokens,
                num_beams,
                length_penalty,
                stop,
                pad_id,
                use_cache,
            )
            for row, prompt in enumerate(prompts)
        ]
    choose = Sampler(sampler, temperature, top_k, top_p, seed)
    lengths = np.array([len(p) for p in prompts])
    width = int(lengths.max()) + max_new_tokens
    buffer = np.full((len(prompts), width), pad_id, dtype="int32")
    for row, prompt in enumerate(prompts):
        buffer[row, : len(prompt)] = prompt
    start = int(lengths.min())
    state = runner.initial_state(list(range(len(prompts))), width)
    if use_cache:
        logits, state = runner.compiled_step(buffer[:, :start], state, position(0))
    else:
        logits = runner.compiled_full(buffer[:, :start], state)
    finished = np.zeros(len(prompts), dtype=bool)
    for t in range(start, width):
        chosen = choose(_last_logits(logits, pad_id))
        generated = t >= lengths
        chosen = np.where(finished, pad_id, chosen)
        buffer[:, t] = np.where(generated, chosen, buffer[:, t])
        finished |= generated & np.isin(chosen, list(stop))
        if finished.all() or t == width - 1:
            break
        if use_cache:
            logits, state = runner.compiled_step(buffer[:, t : t + 1], state, position(t))
        else:
            logits = runner.compiled_full(buffer[:, : t + 1], state)
    return [
        _until_stop(buffer[row, n : n + max_new_tokens].tolist(), stop | {pad_id})
        if finished[row]
        else buffer[row, n : n + max_new_tokens].tolist()
        for row, n in enumerate(lengths)
    ]


def length_normalized(score, length, alpha):
    """Wu et al. (GNMT): `score / ((5 + length) / 6)^alpha`."""
    return score / ((5.0 + length) / 6.0) ** alpha


def beam_search(
    runner, row, prompt, max_new_tokens, num_beams, length_penalty, stop, pad_id, use_cache=True
):
    """Beam search for one prompt; returns the best hypothesis's new ids.

    Each step extends every live beam by every token and keeps the `num_beams` best
    candidates by summed log-probability; a candidate ending in a stop token is set aside as
    finished (scored with the length penalty) and its beam retires. The search ends when no
    beam is live or after `max_new_tokens`; the best finished or live hypothesis wins. With
    one beam this is greedy decoding.
    """
    width = len(prompt) + max_new_tokens
    state = runner.initial_state([row], width)
    ids = np.asarray([prompt], dtype="int32")
    if use_cache:
        logits, state = runner.compiled_step(ids, state, position(0))
    else:
        logits = runner.compiled_full(ids, state)
    log_probs = log_softmax(_last_logits(logits, pad_id))
    beams, scores = [[]], np.zeros(1)
    finished = []
    for n in range(max_new_tokens):
        candidates = (scores[:, None] + log_probs).ravel()
        vocab = log_probs.shape[-1]
        best = np.argsort(-candidates, kind="stable")[:num_beams]
        live, sources, live_scores = [], [], []
        for flat in best:
            if not np.isfinite(candidates[flat]):
                continue
            beam, token = divmod(int(flat), vocab)
            sequence = [*beams[beam], token]
            if token in stop:
                finished.append((length_normalized(candidates[flat], len(sequence),
                                                   length_penalty), sequence[:-1]))  # fmt: skip
            else:
                live.append(sequence)
                sources.append(beam)
                live_scores.append(candidates[flat])
        beams, scores = live, np.asarray(live_scores)
        if not beams or n == max_new_tokens - 1:
            break
        state = select_rows(state, sources)
        ids = np.asarray([[b[-1]] for b in beams], dtype="int32")
        t = len(prompt) + n
        if use_cache:
            logits, state = runner.compiled_step(ids, state, position(t))
        else:
            prefix = np.asarray([[*prompt, *b] for b in beams], dtype="int32")
            logits = runner.compiled_full(prefix, state)
        log_probs = log_softmax(_last_logits(logits, pad_id))
    finished += [
        (length_normalized(s, len(b), length_penalty), b)
        for b, s in zip(beams, scores, strict=True)
    ]
    return max(finished, key=lambda item: item[0])[1]

"""Choosing the next token from logits: greedy, temperature, top-k and top-p (nucleus).

NumPy only, over `(batch, vocab)` float64 logits: one small array per step, and a seeded
`numpy.random.Generator` gives the same sample twice on every backend. Keras-side decoding
(`keras_attn.decoding`) and the server's `/generate` use this one module, so the same seed
gives the same ids in Keras and over HTTP.
"""

import numpy as np


def log_softmax(logits: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Over the last axis. `out=logits` works in place: the same numbers, without the
    vocabulary-sized temporaries (each a fresh allocation the kernel faults in page by page,
    most of a sampled step's cost)."""
    shifted = np.subtract(logits, logits.max(-1, keepdims=True), out=out)
    return np.subtract(shifted, np.log(np.exp(shifted).sum(-1, keepdims=True)), out=shifted)


def force_token(logits: np.ndarray, rows: np.ndarray, token_id: int | None) -> np.ndarray:
    """`logits` where each row of `rows` (a boolean mask) can only choose `token_id`: its
    other logits become -inf and that one 0 (`transformers`' `forced_eos_token_id` on the
    last step of a generation). `token_id=None` leaves them alone."""
    if token_id is None or not rows.any():
        return logits
    forced = np.full(logits.shape[-1], -np.inf)
    forced[token_id] = 0.0
    return np.where(rows[:, None], forced, logits)


def force_ends(
    logits: np.ndarray,
    new_index: np.ndarray | int,
    prompt_lengths: np.ndarray | int,
    max_new_tokens: int,
    forced_bos_token_id: int | None = None,
    forced_eos_token_id: int | None = None,
) -> np.ndarray:
    """`transformers`' two forcing rules, in its order: a row choosing its first new id
    (`new_index` 0) after a one-id prompt (an encoder-decoder's start id) can only choose
    `forced_bos_token_id`; a row choosing its `max_new_tokens`-th id can only choose
    `forced_eos_token_id`, which wins where both hold. `new_index`, `prompt_lengths`: per
    row, or one int for every row."""
    if forced_bos_token_id is None and forced_eos_token_id is None:  # every step's usual case
        return logits
    rows = np.ones(len(logits), bool)
    first = rows & (np.asarray(new_index) == 0) & (np.asarray(prompt_lengths) == 1)
    logits = force_token(logits, first, forced_bos_token_id)
    return force_token(logits, rows & (np.asarray(new_index) == max_new_tokens - 1),
                       forced_eos_token_id)  # fmt: skip


def top_k_filter(logits: np.ndarray, k: int) -> np.ndarray:
    """Keeps each row's `k` largest logits (and ties with the k-th); the rest become -inf."""
    k = min(k, logits.shape[-1])
    kth = np.partition(logits, -k, axis=-1)[:, -k][:, None]
    return np.where(logits >= kth, logits, -np.inf)


def top_p_filter(logits: np.ndarray, p: float) -> np.ndarray:
    """Keeps the smallest set of most likely tokens whose probability reaches `p` (Holtzman
    et al.): a token stays if the tokens more likely than it sum to less than `p`, so the top
    token always stays."""
    order = np.argsort(-logits, axis=-1, kind="stable")
    ordered = np.take_along_axis(logits, order, -1)
    probs = np.exp(log_softmax(ordered))
    before = np.cumsum(probs, -1) - probs
    keep_sorted = before < p - 1e-9  # a set that reaches p up to rounding is complete
    keep_sorted[..., 0] = True  # however small `p` is
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, -1)
    return np.where(keep, logits, -np.inf)


class Sampler:
    """Picks one id per row from `(batch, vocab)` logits.

    Args:
        method: `"greedy"` (argmax) or `"sample"` (draw from the softmax after temperature,
            top-k and top-p, applied in that order, as Hugging Face does).
        temperature: float > 0. Divides the logits. Defaults to `1.0`.
        top_k: optional int. top_p: optional float in (0, 1].
        seed: optional int. The same seed gives the same samples.
    """

    def __init__(
        self,
        method: str = "greedy",
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
    ) -> None:
        if method not in ("greedy", "sample"):
            raise ValueError(
                f"`sampler` must be 'greedy', 'sample' or 'beam'. Received: sampler={method!r}"
            )
        if not temperature > 0:
            raise ValueError(f"`temperature` must be positive. Received: temperature={temperature}")
        if top_k is not None and (not isinstance(top_k, int) or top_k <= 0):
            raise ValueError(f"`top_k` must be a positive int. Received: top_k={top_k!r}")
        if top_p is not None and not 0 < top_p <= 1:
            raise ValueError(f"`top_p` must be in (0, 1]. Received: top_p={top_p!r}")
        self.method = method
        self.temperature = temperature
        self.top_k = top_k
        self.top_p = top_p
        self.rng = np.random.default_rng(seed)

    def filtered(self, logits: np.ndarray) -> np.ndarray:
        """Logits after temperature, top-k and top-p; excluded tokens are -inf."""
        with np.errstate(over="ignore"):
            scaled = logits / self.temperature
        # A temperature so small that finite logits overflow is its limit, greedy: only the
        # top logit of such a row stays (never NaN probabilities, which would pick id 0).
        # Built only for such rows: a full-vocabulary `np.where` costs more than the rest.
        overflow = (np.isinf(scaled) & np.isfinite(logits)).any(-1, keepdims=True)
        if overflow.any():
            top = np.where(logits >= logits.max(-1, keepdims=True), 0.0, -np.inf)
            scaled = np.where(overflow, top, scaled)
        logits = np.asarray(scaled, np.float64)  # float64 whatever came in, as documented
        if self.top_k is not None:
            logits = top_k_filter(logits, self.top_k)
        if self.top_p is not None:
            logits = top_p_filter(logits, self.top_p)
        return logits

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        if self.method == "greedy":
            return logits.argmax(-1)
        # In place on the new array `filtered` returns (see `log_softmax`).
        cumulative = self.filtered(logits)
        np.exp(log_softmax(cumulative, out=cumulative), out=cumulative)
        np.cumsum(cumulative, -1, out=cumulative)
        draws = self.rng.random((len(cumulative), 1))
        chosen = (cumulative < draws).sum(-1)
        return np.minimum(chosen, cumulative.shape[-1] - 1)

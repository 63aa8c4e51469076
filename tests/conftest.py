"""Shared fixtures: a tiny trained causal LM, its tokenizer, and its exported artifact folder."""

import collections
import gc

import keras
import numpy as np
import pytest

TOY_TEXT = [
    "to be or not to be that is the question",
    "whether tis nobler in the mind to suffer",
    "the slings and arrows of outrageous fortune",
    "or to take arms against a sea of troubles",
    "and by opposing end them to die to sleep",
] * 4


def pytest_collection_modifyitems(config, items):
    """Modules that hold slow tests run first, each in its order: the two workers of
    `make test` then share the long runs, instead of one finishing them alone at the end."""

    def module(item):
        return item.nodeid.split("::")[0]

    slow = collections.Counter(module(i) for i in items if i.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[module(item)])  # the most slow tests first; stable


@pytest.fixture(autouse=True, scope="module")
def _release_memory_after_each_module():
    """A pytest worker runs hundreds of modules: their models, traced functions and
    sessions are freed when each module ends (a worker reached 18 GB without this)."""
    yield
    keras.backend.clear_session()
    gc.collect()


@pytest.fixture(scope="session")
def toy_tokenizer():
    from keras_attn.tokenizers import WordPieceTokenizer, train_wordpiece_vocabulary

    return WordPieceTokenizer(train_wordpiece_vocabulary(TOY_TEXT, 200))


@pytest.fixture(scope="session")
def toy_lm(toy_tokenizer):
    """A one-block causal LM trained for a few steps on TOY_TEXT."""
    from keras_attn.data import lm_windows
    from keras_attn.metrics import Perplexity
    from keras_attn.models import build_causal_lm, lm_loss

    keras.utils.set_random_seed(0)
    ids = [toy_tokenizer.tokenize(t).numpy() for t in TOY_TEXT]
    x, y = lm_windows(ids, 8)
    model = build_causal_lm(
        toy_tokenizer.vocabulary_size(), 24, hidden_dim=16, num_layers=1, num_heads=2
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=lm_loss(), metrics=[Perplexity()])
    model.fit(x, y, batch_size=8, epochs=3, verbose=0)
    return model


@pytest.fixture(scope="session")
def toy_artifact(toy_lm, toy_tokenizer, tmp_path_factory):
    from keras_attn_export import export_model

    folder = tmp_path_factory.mktemp("artifacts") / "toy_lm"
    manifest = export_model(toy_lm, folder, tokenizer=toy_tokenizer, verbose=False)
    return folder, manifest


def keras_greedy(model, prompt, steps, pad_token_id=0):
    """Reference greedy decoding: one prompt, full recomputation, written independently."""
    ids = list(prompt)
    for _ in range(steps):
        logits = keras.ops.convert_to_numpy(model(np.array([ids], "int32"), training=False))
        last = logits[0, -1].copy()
        if pad_token_id is not None:
            last[pad_token_id] = -np.inf
        ids.append(int(last.argmax()))
    return ids[len(prompt) :]

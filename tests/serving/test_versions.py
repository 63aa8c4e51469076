"""Model versions follow the repository (issue 26): a removed version is unloaded, a replaced
one reloaded after its hashes check, a failed one retried with backoff, and Triton's
repository index / load / unload."""

import shutil
import threading

import numpy as np
import pytest
from fastapi.testclient import TestClient
from keras_attn_serving import predictor as predictor_module
from keras_attn_serving import repository as repository_module
from keras_attn_serving.server import ModelRepository, create_app

pytestmark = pytest.mark.tf_only  # the fixtures export with TensorFlow

IDS = [[5, 9, 12, 7], [3, 4, 0, 0]]
FLAT = [i for row in IDS for i in row]


@pytest.fixture(scope="module")
def other_artifact(toy_lm, toy_tokenizer, tmp_path_factory):
    """The toy model with other weights: what a replaced version folder holds."""
    from keras_attn_export import export_model

    other = type(toy_lm).from_config(toy_lm.get_config())
    other(np.zeros((1, 4), "int32"))
    other.set_weights([1.5 * w for w in toy_lm.get_weights()])
    folder = tmp_path_factory.mktemp("other") / "toy_lm"
    export_model(other, folder, tokenizer=toy_tokenizer, verbose=False, formats=["onnx"])
    return folder


def infer(client, name="toy", version=None):
    path = f"/v2/models/{name}" + (f"/versions/{version}" if version else "") + "/infer"
    body = {"inputs": [{"name": "token_ids", "shape": [2, 4], "datatype": "INT32",
                        "data": FLAT}]}  # fmt: skip
    return client.post(path, json=body)


def logits(response):
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    return np.array(output["data"]).reshape(output["shape"])


def test_a_removed_version_is_unloaded_with_its_threads(toy_artifact, tmp_path):
    """Before: 60 versions added and removed left threads 74 -> 126 and RSS 438 -> 500 MB."""
    for version in (1, 2):
        shutil.copytree(toy_artifact[0], tmp_path / "toy" / str(version))
    repository = ModelRepository(tmp_path)
    client = TestClient(create_app(repository))
    threads = threading.active_count()
    for version in (1, 2):
        logits(infer(client, version=version))
    assert threading.active_count() > threads
    shutil.rmtree(tmp_path / "toy" / "2")
    assert repository.sweep() == 1
    assert [(n, v) for n, v, *_ in repository.loaded()] == [("toy", 1)]
    assert threading.active_count() == threads + 2  # version 1's two batch workers
    assert infer(client, version=2).status_code == 404
    assert repository.sweep() == 0


def test_a_replaced_version_is_reloaded_after_its_hashes_check(
    toy_artifact, other_artifact, tmp_path
):
    """Before: a version folder replaced on disk kept being served from memory."""
    shutil.copytree(toy_artifact[0], tmp_path / "toy" / "1")
    client = TestClient(create_app(ModelRepository(tmp_path)))
    before = logits(infer(client))
    shutil.rmtree(tmp_path / "toy" / "1")
    shutil.copytree(other_artifact, tmp_path / "toy" / "1")
    after = logits(infer(client))
    expected = predictor_module.Predictor(other_artifact).run({"token_ids": np.array(IDS)})
    np.testing.assert_allclose(after, expected["logits"], atol=1e-6)
    assert np.abs(after - before).max() > 1e-3
    # A replacement whose files do not match their hashes is refused, not served.
    shutil.rmtree(tmp_path / "toy" / "1")
    shutil.copytree(toy_artifact[0], tmp_path / "toy" / "1")
    (tmp_path / "toy" / "1" / "model.onnx").write_bytes(b"tampered")
    refused = infer(client)
    assert refused.status_code == 400 and "not ready" in refused.json()["error"]


def test_a_failed_version_is_retried_with_backoff_not_on_every_request(
    toy_artifact, tmp_path, monkeypatch
):
    """Before: a model that failed its sha256 was hashed again on every request (0.4-0.8 s
    each for 300 MB)."""
    shutil.copytree(toy_artifact[0], tmp_path / "toy" / "1")
    (tmp_path / "toy" / "1" / "model.onnx").write_bytes(b"tampered")
    checks = []
    verify = predictor_module.verify_files
    monkeypatch.setattr(predictor_module, "verify_files", lambda *a: checks.append(1) or verify(*a))
    clock = [1000.0]
    monkeypatch.setattr(repository_module.time, "monotonic", lambda: clock[0])
    client = TestClient(create_app(ModelRepository(tmp_path)))
    for _ in range(20):
        response = infer(client)
        assert response.status_code == 400 and "sha256" in response.json()["error"]
    assert len(checks) == 1
    for waited, loads in [(0.9, 1), (0.2, 2), (1.5, 2), (0.6, 3), (3.9, 3), (0.2, 4)]:
        clock[0] += waited  # retried after 1 s, then 2 s, then 4 s
        assert infer(client).status_code == 400
        assert len(checks) == loads, (waited, loads)
    # Fixed on disk: the next request loads it at once, backoff or not.
    shutil.rmtree(tmp_path / "toy" / "1")
    shutil.copytree(toy_artifact[0], tmp_path / "toy" / "1")
    logits(infer(client))


def test_a_version_removed_while_it_loads_is_a_404_not_a_500(toy_artifact, tmp_path, monkeypatch):
    """Before: 32-33 requests in ~8,000 got 500 "internal error" during such churn."""
    shutil.copytree(toy_artifact[0], tmp_path / "toy" / "1")
    original = predictor_module.Predictor.__init__

    def removed_midway(self, folder, *args, **kwargs):
        shutil.rmtree(folder)
        original(self, folder, *args, **kwargs)

    monkeypatch.setattr(predictor_module.Predictor, "__init__", removed_midway)
    response = infer(TestClient(create_app(ModelRepository(tmp_path))))
    assert response.status_code == 404
    assert response.json() == {"error": "model 'toy' version 1 was removed"}


def test_triton_repository_index_load_and_unload(toy_artifact, tmp_path):
    shutil.copytree(toy_artifact[0], tmp_path / "toy" / "1")
    shutil.copytree(toy_artifact[0], tmp_path / "broken" / "1")
    (tmp_path / "broken" / "1" / "model.onnx").write_bytes(b"tampered")
    repository = ModelRepository(tmp_path)
    client = TestClient(create_app(repository))
    index = client.post("/v2/repository/index").json()
    assert index == [
        {"name": "broken", "version": "1", "state": "UNAVAILABLE", "reason": "not loaded"},
        {"name": "toy", "version": "1", "state": "UNAVAILABLE", "reason": "not loaded"},
    ]
    assert client.post("/v2/repository/models/toy/load").json() == {}
    assert client.post("/v2/repository/models/broken/load").status_code == 400
    states = {e["name"]: e for e in client.post("/v2/repository/index").json()}
    assert states["toy"]["state"] == "READY"
    assert states["broken"]["state"] == "UNAVAILABLE" and "sha256" in states["broken"]["reason"]
    assert client.post("/v2/repository/models/toy/unload").json() == {}
    assert repository.loaded() == []
    assert client.post("/v2/repository/models/nope/unload").status_code == 404

"""Shared export fixtures."""

import keras
import pytest
from keras_attn_export import export_model

from keras_attn.models import Encoder


@pytest.fixture(scope="session")
def fused_encoder(tmp_path_factory):
    """`(encoder, folder, manifest)`: a 2-block GELU encoder (hidden 16, 2 heads, vocabulary 50)
    exported with `optimize=True` (`model.onnx` and the fused, padding-free `model.opt.onnx`)."""
    keras.utils.set_random_seed(0)
    encoder = Encoder(50, 16, hidden_dim=16, num_layers=2, num_heads=2, activation="gelu",
                      dropout=0.0)  # fmt: skip
    folder = tmp_path_factory.mktemp("enc")
    manifest = export_model(encoder, folder, formats=["onnx"], optimize=True, verbose=False)
    return encoder, folder, manifest

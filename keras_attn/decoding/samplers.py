"""The samplers Keras-side decoding uses: the server's own (`keras_attn_serving.sampling`, NumPy
only), so that one seed gives the same ids in `generate` and over HTTP."""

from keras_attn_serving.sampling import (
    Sampler,
    force_ends,
    force_token,
    log_softmax,
    top_k_filter,
    top_p_filter,
)

__all__ = ["Sampler", "force_ends", "force_token", "log_softmax", "top_k_filter", "top_p_filter"]

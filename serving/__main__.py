"""`python -m keras_attn_serving --model-repository DIR`: the same as `keras-attn-serve`."""

from keras_attn_serving.cli import main

if __name__ == "__main__":
    main()

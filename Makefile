# The README's two commands: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench venv clean

venv: $(STAMP)

# Every install goes through constraints.txt (torch pinned to the local CPU build).
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip -c constraints.txt
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# Trace, plan and dry-run GPT-3 175B on 1024 A100s; then plan and train a small GPT
# for real on 4 local processes (gloo), printing its losses.
demo: $(STAMP)
	$(VENV)/bin/planner demo
	@echo
	@echo "== 4. Plan and train gpt-tiny for real on 4 local processes (torchrun, gloo)"
	OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --nproc-per-node 4 examples/train_gpt.py --steps 10

test: $(STAMP)
	$(PY) -m pytest -q --durations=15  # the slowest tests, to keep the 15-min budget in sight

bench: $(STAMP)
	@for f in bench/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info

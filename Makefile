# The README's two commands: `make demo` (set up, run the main job) and
# `make test` (set up, run the test suite). Both work on a fresh clone with only
# Python 3.11+ and a C compiler present.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup setup-test build demo test bench clean

$(VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q 'Cython>=3.0' 'setuptools>=77' wheel 'numpy>=1.26'
	$(PY) -m pip install -q --no-build-isolation -e '.[demo]'
	touch $@

# The test tools come on top, only for the targets that need them; the
# Spark test needs a Java runtime and the sync test redis-server (Debian's,
# installed where apt-get may; otherwise those tests are skipped and say so).
$(VENV)/.installed-test: $(VENV)/.installed
	{ command -v java && command -v redis-server; } >/dev/null 2>&1 || \
		{ [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq default-jre-headless redis-server >/dev/null; } || \
		echo "no Java runtime or redis-server: the Spark or Redis tests will be skipped"
	$(PY) -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['test']))" \
		| xargs $(PY) -m pip install -q
	touch $@

setup: $(VENV)/.installed

setup-test: $(VENV)/.installed-test

# Rebuild the compiled core in place whenever csrc/ changed (a no-op otherwise).
build: setup
	$(PY) setup.py -q build_ext --inplace

demo: build
	$(PY) -m rune_fast.demo

test: setup-test build
	$(PY) -m pytest -q -n auto --maxprocesses 4

bench: setup-test build
	$(PY) -m pytest bench -q --benchmark-columns=min,median,mean,ops --benchmark-sort=name
	$(PY) -m rune_fast.bench

clean:
	rm -rf build $(VENV) rune_fast/*.so csrc/*.c rune-state .benchmarks

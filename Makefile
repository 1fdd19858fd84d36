# The two commands of the README. Each sets up .venv first (idempotent; see scripts/setup.sh).
PY := .venv/bin/python
OUT ?= grades
JOBS ?= 2
# Tests and CI read TinyShakespeare from the course's shared data folder when it sits beside
# the checkout; elsewhere mlexp finds it in the user cache or downloads and verifies it.
SHARED_DATA := $(wildcard ../shared/data/tinyshakespeare.txt)
ifneq ($(SHARED_DATA),)
export MLEXP_DATA_DIR ?= $(abspath ../shared/data)
endif

.PHONY: setup grade test lessons
setup:
	bash scripts/setup.sh

grade: setup
	$(PY) -m autograder grade -j $(JOBS) --out $(OUT)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

lessons: setup
	$(PY) -m autograder build

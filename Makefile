# The commands of the README and its guides in docs/, the student's and the course author's. Each sets up .venv
# first (idempotent; see scripts/setup.sh): `grade` and `lessons` install only what grading
# needs, `lab` adds JupyterLab, `test` adds the test tools.
PY := .venv/bin/python
OUT ?= grades
JOBS ?= 2
SAMPLE ?= 1
# Tests and CI read TinyShakespeare from the course's shared data folder when it sits beside
# the checkout; elsewhere mlexp finds it in the user cache or downloads and verifies it.
SHARED_DATA := $(wildcard ../shared/data/tinyshakespeare.txt)
ifneq ($(SHARED_DATA),)
export MLEXP_DATA_DIR ?= $(abspath ../shared/data)
endif

BOOK ?= build/book

.PHONY: setup setup-lab setup-test setup-book book grade grade-all lab test test-fast lessons check-generated colab
setup:
	bash scripts/setup.sh grade

setup-lab:
	bash scripts/setup.sh lab

setup-test:
	bash scripts/setup.sh test

setup-book:
	bash scripts/setup.sh book

# A sample of the demo class: SAMPLE students per lesson (a few minutes); grade-all: all of it.
grade: setup
	$(PY) -m autograder grade --sample $(SAMPLE) -j $(JOBS) --out $(OUT)

grade-all: setup
	$(PY) -m autograder grade -j $(JOBS) --out $(OUT)

# JupyterLab on the lessons, from the course's environment.
lab: setup-lab
	.venv/bin/jupyter lab lessons/

# Two workers (the CI machine has two cores; TEST_WORKERS=0 runs in one process), then the timing
# summary of scripts/test_times.py: the ten slowest tests, the total, and the fast tier's limits.
TEST_WORKERS ?= 2
test: setup-test
	@status=0; $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS) || status=$$?; \
	$(PY) scripts/test_times.py summary || [ $$status -ne 0 ] || status=1; exit $$status

# Everything but the tests marked slow (those that run notebooks, grade classes or train).
test-fast: setup-test
	@status=0; $(PY) -m pytest -m "not slow" $(PYTEST_ARGS) || status=$$?; \
	$(PY) scripts/test_times.py summary || [ $$status -ne 0 ] || status=1; exit $$status

# After editing solutions/ or the catalogue: shared cells -> lessons/ -> the demo class, in order.
lessons: setup
	$(PY) scripts/lesson_cells.py
	$(PY) -m autograder build
	$(PY) -m autograder demo

# Every generated file is up to date, and each demo student still gets its hint (exit 1 if not).
check-generated: setup
	@status=0; \
	$(PY) scripts/lesson_cells.py --check || status=1; \
	$(PY) -m autograder build --check || status=1; \
	$(PY) -m autograder demo --check --check-hints || status=1; \
	exit $$status

# The course as a static web site in $(BOOK) (docs/authors.md: The course as a book). Every lesson runs at
# full size the first time (about an hour of CPU); an unchanged lesson comes from the cache.
book: setup-book
	$(PY) -m autograder book $(BOOK)

# The course file students upload to Colab before the course is on GitHub (dist/mlexp-*.whl).
colab: setup
	$(PY) -m autograder build --colab

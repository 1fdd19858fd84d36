"""mlexp.runtime: whether a lesson is being graded, and temporary_environ, the one save-and-restore of
environment variables that the book, the dry run, mlexp.check and scripts/lesson_cells.py use (issue 42)."""
import os

import pytest

from mlexp.runtime import budget, is_grading, temporary_environ

A, B, C = "MLEXP_TEST_ENV_A", "MLEXP_TEST_ENV_B", "MLEXP_TEST_ENV_C"


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    monkeypatch.setenv(A, "before")
    monkeypatch.setenv(B, "kept")
    monkeypatch.delenv(C, raising=False)


def test_values_are_set_and_removed_inside_and_put_back_after():
    with temporary_environ({A: "inside"}, **{B: None, C: "new"}):
        assert os.environ[A] == "inside" and B not in os.environ and os.environ[C] == "new"
    assert os.environ[A] == "before" and os.environ[B] == "kept" and C not in os.environ
    with temporary_environ(**{C: None}):                        # removing what is not there
        assert C not in os.environ
    assert C not in os.environ


def test_put_back_when_the_block_raises():
    with pytest.raises(KeyError, match="boom"):
        with temporary_environ(**{A: None, C: "new"}):
            raise KeyError("boom")
    assert os.environ[A] == "before" and C not in os.environ


def test_a_change_inside_the_block_to_a_named_variable_is_undone_others_stay():
    with temporary_environ(**{A: "inside"}):
        os.environ[A] = "changed by the block"
        os.environ[C] = "set by the block, not named"
    assert os.environ[A] == "before" and os.environ[C] == "set by the block, not named"


def test_a_value_that_is_not_a_string_changes_nothing():
    with pytest.raises(TypeError, match=A):
        with temporary_environ(**{B: None, A: 1}):
            pass
    assert os.environ[A] == "before" and os.environ[B] == "kept"


def test_grading_size_follows_the_variable():
    with temporary_environ(NBGRADER_EXECUTION="validate"):
        assert is_grading() and budget(full=1000, grading=10) == 10
    with temporary_environ(NBGRADER_EXECUTION=None):
        assert not is_grading() and budget(full=1000, grading=10) == 1000

"""Feedback without hidden tests: an nbgrader preprocessor run by generate_feedback."""
from nbgrader.preprocessors import ClearHiddenTests

__all__ = ["HideHiddenTests"]

NOTE = "(traceback not shown: this test cell holds hidden tests)"


class HideHiddenTests(ClearHiddenTests):
    """Remove hidden test regions, and the tracebacks that would quote them, from feedback.

    ``nbgrader autograde`` restores every test cell from the gradebook, hidden tests included,
    and ``generate_feedback`` renders that notebook as it is, so students would read the hidden
    tests. This preprocessor deletes the ``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS``
    lines from each cell's source. A traceback of such a cell quotes the failing line, which may
    be hidden, so its error output is cut to ``AssertionError: Hint: ...`` (the exception type
    and message). Cells without hidden tests keep their full output.
    """

    def preprocess_cell(self, cell, resources, cell_index):
        removed = self._remove_hidden_test_region(cell)
        if removed and cell.cell_type == "code":
            for output in cell.get("outputs", []):
                if output.output_type == "error":
                    output.traceback = [f"{output.ename}: {output.evalue}", NOTE]
        return cell, resources

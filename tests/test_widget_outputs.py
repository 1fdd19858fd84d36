"""An Output widget's prints never make a cell wait out its time limit (mlexp.check.output_widgets_read_only).

nbclient answered each print inside ``with out:`` by writing to the kernel's shell socket while it
waited on that socket for the cell's reply; now and then the reply's wake-up was lost and the
cell waited its whole limit (CI: lesson 04's cache calculator, 600 s, in the check and in grading).
"""
import nbformat
import pytest
from nbclient import NotebookClient

from autograder.config import KERNEL_ARGS
from mlexp.check import output_widgets_read_only

TIMEOUT_S = 20
PRINTS = "for i in range(30):\n    with out:\n        clear_output(wait=True)\n        print('step', i)\n"


class NoShell:
    """A kernel client whose shell channel must not be written to."""
    class shell_channel:
        @staticmethod
        def send(msg):
            raise AssertionError(f"wrote {msg['msg_type']} to the kernel")

    session = None


def test_an_output_widget_keeps_its_prints_and_writes_nothing_to_the_kernel():
    client = output_widgets_read_only(NotebookClient(nbformat.v4.new_notebook()))
    client.kc = NoShell()
    state = {"_model_module": "@jupyter-widgets/output", "_model_name": "OutputModel", "outputs": []}
    opened = {"msg_type": "comm_open", "parent_header": {}, "buffers": [],
              "content": {"comm_id": "c1", "target_name": "jupyter.widget", "data": {"state": state}}}
    client.handle_comm_msg([], opened, 0)
    widget = client.comm_objects["c1"]
    widget.handle_msg({"content": {"comm_id": "c1", "data": {"state": {"msg_id": "run-1"}}}})
    printed = {"msg_type": "stream", "header": {"msg_type": "stream"}, "parent_header": {"msg_id": "run-1"},
               "content": {"name": "stdout", "text": "step 0\n"}}
    cell_outputs = []
    client.output(cell_outputs, printed, None, 0)
    assert cell_outputs == []                                        # the print went to the widget
    assert client.widget_state["c1"]["outputs"][0]["text"] == "step 0\n"


@pytest.mark.slow
def test_many_cells_printing_into_an_output_widget_never_wait_their_limit():
    cells = ["import ipywidgets as w\nfrom IPython.display import clear_output, display\nout = w.Output()\n"
             "display(out)"] + [PRINTS] * 30
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    output_widgets_read_only(NotebookClient(
        nb, timeout=TIMEOUT_S, kernel_name="python3", allow_errors=True, interrupt_on_timeout=True,
        extra_arguments=list(KERNEL_ARGS),
        error_on_timeout={"ename": "CellTimeoutError", "evalue": "", "traceback": []})).execute()
    waited = [i for i, c in enumerate(nb.cells) for o in c.outputs if o.get("ename") == "CellTimeoutError"]
    assert waited == [], f"cells {waited} waited {TIMEOUT_S} s for a reply that had come"
    shown = [o for c in nb.cells for o in c.outputs if o.output_type == "display_data"]
    assert shown, "the Output widget was not displayed"

"""raydg.forked.apart: torch's work in a forked child, so that an experiment's own process
never imports torch (issue 29: about 265 MB of private memory)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

# In a fresh interpreter: pytest's own process has torch imported (apart would run in it).
CASES = textwrap.dedent("""
    import json, os, sys
    from raydg.errors import RaydgError
    from raydg.forked import apart

    said, out = [], {}

    def work(log):
        import torch
        log("from the child")
        return {"pid": os.getpid(), "sum": float(torch.arange(4.0).sum())}

    out["result"] = apart(work, said.append)
    out["said"], out["here"] = said, os.getpid()

    def refuse(log):
        raise RaydgError("no such method: fedfoo")

    def crash(log):
        return {}["missing"]

    def die(log):
        os._exit(3)

    def unpicklable(log):
        return lambda: None

    for name, fn in [("refuse", refuse), ("crash", crash), ("die", die),
                     ("unpicklable", unpicklable)]:
        try:
            apart(fn, said.append)
        except BaseException as err:
            out[name] = [type(err).__name__, str(err), getattr(err, "__notes__", [])]
    out["torch"] = "torch" in sys.modules
    print(json.dumps(out))
""")


def test_work_runs_in_a_child_and_its_answer_lines_and_errors_come_back():
    done = subprocess.run([sys.executable, "-c", CASES], capture_output=True, text=True,
                          check=True, timeout=120)
    out = json.loads(done.stdout)
    assert out["result"]["sum"] == 6.0 and out["result"]["pid"] != out["here"]
    assert out["said"] == ["from the child"]
    assert out["torch"] is False
    assert out["refuse"] == ["RaydgError", "no such method: fedfoo", []]
    kind, message, notes = out["crash"]
    assert (kind, message) == ("KeyError", "'missing'")
    assert notes[0].startswith("in raydg's planning process:") and "crash" in notes[0]
    assert out["die"][:2] == ["RaydgError", "raydg's planning process ended (exit status 3) "
                                            "before it answered"]
    assert out["unpicklable"][0] == "RaydgError"
    assert out["unpicklable"][1].startswith("function: ")


RUN = textwrap.dedent("""
    import json, sys
    if sys.argv[1] == "torch-here":
        import torch  # planning and the initial weights then run in this process
    from raydg import api

    result = api.run("digits-style", method="fedavg", target="sketch", rounds=1, local_steps=5,
                     clients=3, tracking_uri=sys.argv[2], storage=sys.argv[3])
    print(json.dumps({"torch": "torch" in sys.modules, "rows": result.rows.to_pylist()}))
""")


@pytest.mark.slow
def test_an_experiments_process_imports_no_torch_and_gets_the_same_result(tmp_path):
    """A whole run through the Python API: planning in a child leaves the process without
    torch, and its result is the same as planning in the process."""
    outs = {}
    for mode in ("no-torch", "torch-here"):
        done = subprocess.run(
            [sys.executable, "-c", RUN, mode, f"sqlite:///{tmp_path}/{mode}.db",
             str(tmp_path / mode)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        outs[mode] = json.loads(done.stdout.splitlines()[-1])
    assert outs["no-torch"]["torch"] is False and outs["torch-here"]["torch"] is True
    assert outs["no-torch"]["rows"] == outs["torch-here"]["rows"]

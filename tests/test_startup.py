"""raydg.startup: heavy imports with the cyclic collector paused, then frozen once, in a Ray
worker or when asked. Each case but the last runs in a fresh interpreter: freezing the test
process's heap would outlive the test."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import ray


def _run(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, check=True)
    return json.loads(done.stdout)


def test_imports_run_with_the_collector_paused_and_their_objects_end_frozen():
    seen = _run("""
        import gc, json, sys
        from raydg.startup import heavy_imports
        with heavy_imports(freeze=True):
            during = gc.isenabled()
            import fractions  # a module this interpreter has not imported
        print(json.dumps({"during": during, "after": gc.isenabled(),
                          "frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects())}))
    """)
    assert seen["during"] is False and seen["after"] is True
    assert seen["frozen"] > 1000  # the interpreter's and the module's objects
    assert seen["tracked"] < 100  # what remains for the collector to walk


def test_nothing_new_imported_freezes_nothing_and_an_inner_block_leaves_the_collector_off():
    seen = _run("""
        import gc, json
        from raydg.startup import heavy_imports
        import fractions
        data = [[] for _ in range(1000)]  # a caller's objects, made after its imports
        with heavy_imports(freeze=True):
            import fractions  # already imported
        again = gc.get_freeze_count()
        with heavy_imports(freeze=True):
            with heavy_imports(freeze=True):
                import decimal
            inner = gc.isenabled()
        print(json.dumps({"again": again, "inner": inner, "after": gc.isenabled()}))
    """)
    assert seen["again"] == 0  # the caller's data stays collectable
    assert seen["inner"] is False and seen["after"] is True


def test_preload_imports_the_modules_it_names_and_freezes():
    seen = _run("""
        import gc, json, sys
        from raydg.startup import preload
        preload("fractions", "decimal")
        print(json.dumps({"imported": "fractions" in sys.modules and "decimal" in sys.modules,
                          "frozen": gc.get_freeze_count() > 0, "on": gc.isenabled()}))
    """)
    assert seen == {"imported": True, "frozen": True, "on": True}


def test_the_client_actors_module_freezes_torch_in_a_ray_worker_only(ray_session):
    plain = _run("""
        import gc, json
        import raydg.engine.client
        print(json.dumps({"on": gc.isenabled(), "frozen": gc.get_freeze_count()}))
    """)
    assert plain == {"on": True, "frozen": 0}  # a user's process: nothing frozen

    @ray.remote
    def in_a_worker() -> dict:
        import gc

        import raydg.engine.client  # noqa: F401

        return {"on": gc.isenabled(), "frozen": gc.get_freeze_count()}

    worker = ray.get(in_a_worker.remote())  # perhaps a worker that ran other tests' tasks
    assert worker["on"] and worker["frozen"] > 100_000, worker

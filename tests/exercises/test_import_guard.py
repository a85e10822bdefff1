"""ddp_tutorial/exercises/import_guard.py: every route to a refused module fails while the guard is on, none after."""

import importlib
import runpy
from pathlib import Path

import pytest

import ddp_tutorial.exercises
from ddp_tutorial.exercises.import_guard import import_guard
from ddp_tutorial.exercises.tracing import NotAllowed

SOLUTIONS = "ddp_tutorial.exercises.solutions"
RING = Path(ddp_tutorial.exercises.__file__).parent / "solutions" / "ring_all_reduce.py"


def learner(code: str) -> dict:
    """Run ``code`` as a learner's file does (exec'd in a fresh namespace); return its namespace."""
    namespace: dict = {"__name__": "exercise_file"}
    exec(compile(code, "mine.py", "exec"), namespace)
    return namespace


ROUTES = {
    "a computed name": "import importlib\nm = importlib.import_module('ddp_tutorial.exercises.' + 'solu' + 'tions')",
    "__import__": "m = __import__('ddp_tutorial.exercises.solutions.ring_all_reduce')",
    "importlib.__import__": "import importlib\nm = importlib.__import__('ddp_tutorial.exercises.solutions')",
    "from the package": "from ddp_tutorial.exercises import solutions",
    "from the package, the module": "from ddp_tutorial.exercises.solutions import ring_all_reduce",
    "the file by path": f"text = open({str(RING)!r}).read()",
    "runpy": f"import runpy\nm = runpy.run_path({str(RING)!r})",
    "a spec from the file": ("import importlib.util\n"
                             f"spec = importlib.util.spec_from_file_location('x', {str(RING)!r})\n"
                             "m = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(m)"),
}


@pytest.mark.parametrize("route", ROUTES)
def test_every_route_to_the_solutions_is_refused_while_guarded(route):
    importlib.import_module("ddp_tutorial.exercises.solutions.ring_all_reduce")  # the checker had it loaded
    with import_guard([SOLUTIONS]), pytest.raises(NotAllowed, match="write this yourself"):
        learner(ROUTES[route])
    # and after the guard, the same code runs
    learner(ROUTES[route])


def test_an_already_imported_module_is_not_reachable_through_its_parent():
    importlib.import_module("ddp_tutorial.exercises.solutions.ring_all_reduce")
    with import_guard([SOLUTIONS]), pytest.raises(AttributeError, match="solutions"):
        learner("import ddp_tutorial.exercises\nf = ddp_tutorial.exercises.solutions.ring_all_reduce")
    assert learner("import ddp_tutorial.exercises\nf = ddp_tutorial.exercises.solutions.ring_all_reduce")["f"]


def test_a_lesson_module_is_refused_and_the_rest_of_the_course_is_not():
    with import_guard([SOLUTIONS, "ddp_tutorial.comm.ring"]):
        with pytest.raises(NotAllowed, match="ddp_tutorial.comm.ring"):
            learner("from ddp_tutorial.comm import ring")
        allowed = learner("import torch.distributed as dist\nfrom ddp_tutorial.env import rank_device\n"
                          "from ddp_tutorial.comm import collectives")
        assert callable(allowed["rank_device"])


def test_guards_nest_and_the_outer_holds_after_the_inner():
    with import_guard([SOLUTIONS]):
        with import_guard(["ddp_tutorial.comm.ring"]):
            with pytest.raises(NotAllowed):
                learner(f"open({str(RING)!r})")
        with pytest.raises(NotAllowed):
            learner(f"open({str(RING)!r})")
    assert runpy.run_path(str(RING))["ring_all_reduce"]


def test_a_warning_from_a_refused_file_still_shows_its_line():
    """warnings and tracebacks read source lines through linecache: the guard lets those through."""
    import warnings

    code = compile("import warnings\nwarnings.warn('from the solution', UserWarning)\n", str(RING), "exec")
    with import_guard([SOLUTIONS]), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(code, {})
        shown = warnings.formatwarning(caught[0].message, caught[0].category, caught[0].filename, caught[0].lineno)
    assert "from the solution" in shown

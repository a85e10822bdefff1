"""Where the learner's copies live, seeded from the stubs on first use, and how a path is shown.

In a checkout of the course (an editable install, ``make lab``) the copies are in
``<repo>/my_exercises/``, which git ignores; installed from a wheel they are in
``~/.ddp_tutorial/my_exercises/``. ``DDP_TUTORIAL_EXERCISES_DIR`` puts them elsewhere.
With ``DDP_TUTORIAL_EXERCISES_FRESH=1`` the checker reads the pristine stubs instead and
writes nothing: what nbval should see, whatever the learner has written meanwhile.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ddp_tutorial.exercises.exercise import LEARNER_FOLDER_NAME

FOLDER_ENV = "DDP_TUTORIAL_EXERCISES_DIR"
FRESH_ENV = "DDP_TUTORIAL_EXERCISES_FRESH"
PACKAGE_DIR = Path(__file__).resolve().parent
STUBS_DIR = PACKAGE_DIR / "stubs"
SOLUTIONS_DIR = PACKAGE_DIR / "solutions"


def checkout_root() -> Path | None:
    """The course's repository when the package runs from one (editable install), else None."""
    root = PACKAGE_DIR.parents[1]
    return root if (root / "pyproject.toml").is_file() and (root / "notebooks").is_dir() else None


def folder() -> Path:
    """The learner's exercise folder (not created here)."""
    if os.environ.get(FOLDER_ENV):
        return Path(os.environ[FOLDER_ENV]).expanduser().absolute()
    root = checkout_root()
    return root / LEARNER_FOLDER_NAME if root else Path.home() / ".ddp_tutorial" / LEARNER_FOLDER_NAME


def fresh() -> bool:
    """True when checks must read the stubs, not the learner's copies (``DDP_TUTORIAL_EXERCISES_FRESH=1``)."""
    return os.environ.get(FRESH_ENV, "") not in ("", "0")


def stub_file(name: str) -> Path:
    return STUBS_DIR / f"{name}.py"


def solution_file(name: str) -> Path:
    return SOLUTIONS_DIR / f"{name}.py"


def learner_path(name: str) -> Path:
    """Where the learner's copy of exercise ``name`` lives (it may not exist yet)."""
    return folder() / f"{name}.py"


def seed() -> Path:
    """Create the folder if needed and copy in every stub the learner has no copy of yet."""
    target = folder()
    target.mkdir(parents=True, exist_ok=True)
    for stub in sorted(STUBS_DIR.glob("*.py")):
        if stub.name != "__init__.py" and not (target / stub.name).exists():
            shutil.copyfile(stub, target / stub.name)
    return target


def learner_file(name: str) -> Path:
    """The learner's copy of exercise ``name``, seeded from its stub on first use."""
    path = learner_path(name)
    if not path.exists():
        seed()
    return path


def reset(name: str) -> Path:
    """Put exercise ``name``'s stub back in place of the learner's copy; return the copy's path."""
    seed()
    path = learner_path(name)
    shutil.copyfile(stub_file(name), path)
    return path


def shown(path: Path | str) -> str:
    """``path`` as stored output may show it: relative to the checkout or ``~``, never machine-specific."""
    path = Path(path).expanduser().absolute()
    for base, prefix in ((checkout_root(), ""), (Path.home(), "~/")):
        if base is not None:
            try:
                return prefix + path.relative_to(base).as_posix()
            except ValueError:
                pass
    return str(path)

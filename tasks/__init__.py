"""Luigi tasks of the pipeline; ``luigi --module tasks <Task> --config <yaml>`` finds each of them.

The task of a stage is in ``tasks/<module>.py``, beside the stage's ``pipeline/stages/<module>.py``,
which declares it (``pipeline.dag``); importing this package defines every one of them, so Luigi knows
them, and ``from tasks import Train`` finds any of them by name.
"""

from tasks.base import pipeline_tasks

# Luigi finds a task by the name its class was defined with: defining them is what this import is for.
_TASKS = pipeline_tasks()


def __getattr__(name: str):
    """A task of the pipeline by name (``tasks.Train``)."""
    if name in _TASKS:
        return _TASKS[name]
    raise AttributeError(f"module 'tasks' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The package's names, with every task's."""
    return sorted({*globals(), *_TASKS})

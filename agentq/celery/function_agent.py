"""The function form of an agent: ``agent(app, name)`` and ``@agent.node``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from agentq.celery.task import AgentTask
from agentq.errors import InvalidArgument

NodeFunction = TypeVar("NodeFunction", bound=Callable[..., Any])


class FunctionAgent(AgentTask):
    """An :class:`AgentTask` whose nodes are plain functions ``node(run, **input)``,
    added with :meth:`node`. Everything else (``delay``, ``wait``, ``resume``, the
    guarantees) is the class form's."""

    def node(self, fn: NodeFunction) -> NodeFunction:
        """Add ``fn`` as the node named after it; returns ``fn`` unchanged."""
        name = getattr(fn, "__name__", "")
        if not callable(fn) or not name.isidentifier() or name.startswith("_"):
            raise InvalidArgument(
                f"agent {self.name}: a node must be a function with a public name, got "
                f"{fn!r}; define it with def"
            )
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise InvalidArgument(
                f"agent {self.name}: node {name} is a generator (it yields); a node returns "
                "the next node's name, Done(result) or Interrupt(...): return instead of yield"
            )
        try:
            # The wrapper's own: a decorator may supply what the function it wraps takes.
            signature: inspect.Signature | None = inspect.signature(fn, follow_wrapped=False)
        except ValueError:
            signature = None  # none to read (a builtin): it fails when called, if it does
        if signature is not None:
            try:
                signature.bind_partial(None)
            except TypeError:
                # Else every thread fails at this node with Python's TypeError, naming no
                # thread nor step.
                params = signature.replace(return_annotation=inspect.Signature.empty)
                raise InvalidArgument(
                    f"agent {self.name}: node {name}{params} takes no run; a node is "
                    f"called with its run first: def {name}(run, ...)"
                ) from None
        if hasattr(AgentTask, name):
            raise InvalidArgument(
                f"agent {self.name}: a node cannot be named {name!r}, a Celery or agentq "
                "task attribute of that name would be hidden; rename the function"
            )
        # On the agent's own class, where the driver looks nodes up: a staticmethod, since a
        # function node takes no self.
        setattr(type(self), name, staticmethod(fn))
        return fn


def agent(app: Any, name: str, **options: Any) -> FunctionAgent:
    """Create and register an agent whose nodes are functions, as ``@app.task`` does for
    a plain task::

        support = agentq.agent(app, "support_agent", retry_on=(RateLimitError,))

        @support.node
        def start(run, question):
            run.state["messages"] = [{"role": "user", "content": question}]
            return "model"

    ``options`` become attributes of the task class, as with ``@app.task(**options)``:
    ``retry_on``, ``append_only``, ``entry_node`` and Celery's own (``queue``, ...).
    The entry node is ``start`` unless ``entry_node`` names another.
    """
    if not isinstance(name, str) or not name:
        raise InvalidArgument(
            f"an agent needs a task name, got {name!r}; e.g. agent(app, 'support_agent')"
        )
    if isinstance(options.get("append_only"), str):
        raise InvalidArgument(
            f"agent {name}: append_only={options['append_only']!r} is one string; name the "
            "fields in a tuple, e.g. append_only=('messages',)"
        )
    cls = type(f"FunctionAgent[{name}]", (FunctionAgent,), {"name": name, **options})
    task: FunctionAgent = app.register_task(cls())
    return task

"""``AsyncMemory``: the ``Memory`` API for asyncio code, over the same core.

There is no second implementation to drift (mem0 copy-pasted its async class and the two
diverged): every public method of ``Memory`` (``_METHODS``, read off the class) is wrapped once by
``_wrap`` and runs in a worker thread with ``asyncio.to_thread`` so the event loop never blocks on
SQLite, the embedder or an LLM call. ``tests/doors/test_async_parity.py`` runs the same
scenarios through both classes and checks the results are identical.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .memory import Memory

if TYPE_CHECKING:
    from collections.abc import Coroutine
    from typing import Concatenate, ParamSpec

    from .backlog import PlacementFailure
    from .config import Settings
    from .embed import Embedder
    from .llm import LLM, LLMRunner
    from .store.base import Store

    _P = ParamSpec("_P")
    _R = TypeVar("_R")

    def _as_async(fn: Callable[Concatenate[Memory, _P], _R]) -> Callable[Concatenate[AsyncMemory, _P], Coroutine[Any, Any, _R]]: ...

# The one list: every public method of Memory except the lifecycle ones, derived from the
# class itself so a method added to Memory is async at once (no list to forget to update).
_LIFECYCLE = frozenset({"close"})
_METHODS = tuple(
    name for name, value in vars(Memory).items()
    if not name.startswith("_") and callable(value) and not isinstance(value, (staticmethod, classmethod))
    and name not in _LIFECYCLE
)


class AsyncMemory:
    """Async twin of :class:`arbormem.Memory`: same constructor, same methods, awaitable.

    ``AsyncMemory(...)`` takes the arguments of ``Memory`` or wraps an existing one with
    ``AsyncMemory(memory=mem)`` (both then share one store, embedder and lock)::

        async with AsyncMemory("memory.db") as mem:
            await mem.add(messages, user_id="u1")
            r = await mem.recall("what did we decide?", user_id="u1", max_tokens=512)
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        memory: Memory | None = None,
        store: Store | None = None,
        database_url: str | None = None,
        embedder: Embedder | str | None = None,
        llm: LLM | LLMRunner | None = None,
        settings: Settings | None = None,
    ) -> None:
        if memory is not None:
            if any(x is not None for x in (path, store, database_url, embedder, llm, settings)):
                from .errors import ConfigError

                raise ConfigError("pass either memory= or Memory's arguments, not both")
            self.sync = memory
        else:
            self.sync = Memory(path, store=store, database_url=database_url, embedder=embedder,
                               llm=llm, settings=settings)

    async def close(self) -> None:
        """Close the underlying Memory (and its store)."""
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncMemory:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    if TYPE_CHECKING:  # precise types for checkers and editors; runtime methods come from _wrap
        begin = _as_async(Memory.begin)
        complete = _as_async(Memory.complete)
        fail = _as_async(Memory.fail)
        add = _as_async(Memory.add)
        add_many = _as_async(Memory.add_many)
        add_document = _as_async(Memory.add_document)
        delete_document = _as_async(Memory.delete_document)
        import_exchanges = _as_async(Memory.import_exchanges)
        warm_up = _as_async(Memory.warm_up)
        recall = _as_async(Memory.recall)
        search = _as_async(Memory.search)
        get = _as_async(Memory.get)
        exchanges = _as_async(Memory.exchanges)
        topics = _as_async(Memory.topics)
        topic = _as_async(Memory.topic)
        tree = _as_async(Memory.tree)
        stats = _as_async(Memory.stats)
        read = _as_async(Memory.read)
        delete = _as_async(Memory.delete)
        forget_topic = _as_async(Memory.forget_topic)
        delete_user = _as_async(Memory.delete_user)
        organize = _as_async(Memory.organize)
        consolidate = _as_async(Memory.consolidate)
        topic_detail = _as_async(Memory.topic_detail)
        history = _as_async(Memory.history)
        undo = _as_async(Memory.undo)
        set_recall_mode = _as_async(Memory.set_recall_mode)
        pin = _as_async(Memory.pin)
        llm_log = _as_async(Memory.llm_log)
        flush = _as_async(Memory.flush)

    @property
    def placement_errors(self) -> tuple[PlacementFailure, ...]:
        """:attr:`Memory.placement_errors` (a read of memory, no I/O)."""
        return self.sync.placement_errors

    def __getattr__(self, name: str) -> Any:
        # Only reached for names Memory does not have either. Declaring it also tells type
        # checkers that the generated methods exist.
        raise AttributeError(f"AsyncMemory has no attribute {name!r}")


def _wrap(name: str) -> Callable[..., Any]:
    sync_fn = getattr(Memory, name)

    @functools.wraps(sync_fn)
    async def method(self: AsyncMemory, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(getattr(self.sync, name), *args, **kwargs)

    method.__doc__ = f"Async :meth:`Memory.{name}` (runs in a worker thread).\n\n{sync_fn.__doc__ or ''}"
    return method


for _name in _METHODS:
    setattr(AsyncMemory, _name, _wrap(_name))
del _name

__all__ = ["AsyncMemory"]

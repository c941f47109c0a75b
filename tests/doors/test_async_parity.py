"""AsyncMemory and Memory share one core: same methods, same signatures, identical results."""

from __future__ import annotations

import asyncio
import inspect
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from arbormem import (
    AsyncMemory,
    CallableEmbedder,
    Memory,
    NotFoundError,
    StateError,
    ValidationError,
)
from tests.conftest import chat

Call = Callable[..., Any]

_ID = re.compile(r"\b(?:[a-z]{1,4}_[0-9a-f]{8,}|root:[\w-]+)\b")


def normalise(value: Any) -> Any:
    """JSON view with random ids replaced by their order of appearance and timings dropped."""
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    elif isinstance(value, list):
        value = [v.to_dict() if hasattr(v, "to_dict") else v for v in value]
    seen: dict[str, str] = {}

    def ids(text: str) -> str:
        return _ID.sub(lambda m: seen.setdefault(m.group(0), f"<id{len(seen)}>"), text)

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            return {ids(str(k)): walk(x) for k, x in v.items() if k not in ("timings_ms",)}
        if isinstance(v, list | tuple):
            return [walk(x) for x in v]
        return ids(v) if isinstance(v, str) else v

    return walk(value)


def scenario_lifecycle(call: Call) -> list[Any]:
    out = []
    x = call("begin", "My friend Leo is allergic to peanuts", user_id="u1", at="2024-03-01T10:00:00Z")
    out.append(x)
    out.append(call("complete", x.id, "Noted, no peanuts for Leo.", at="2024-03-01T10:00:05Z"))
    y = call("begin", "Will it rain tomorrow?", user_id="u1", at="2024-03-01T11:00:00Z")
    out.append(call("fail", y.id, "model timeout"))
    for exc, args in ((StateError, ("complete", y.id, "late")), (NotFoundError, ("get", "x_0000000000"))):
        with pytest.raises(exc):
            call(*args)
    with pytest.raises(ValidationError):
        call("add", [], user_id="u1")
    out.append(call("add", chat("Planning Maya's birthday party", "Indoors or outside?"), user_id="u1",
                    at="2024-03-02T10:00:00Z", metadata={"k": 1}))
    out.append(call("exchanges", user_id="u1"))
    out.append(call("exchanges", user_id="u1", status="failed"))
    out.append(call("stats", user_id="u1"))
    return out


def scenario_bulk_recall_tree(call: Call, demo: dict[str, Any]) -> list[Any]:
    out: list[Any] = [call("add_many", demo["exchanges"], user_id="demo")]
    out.append(call("recall", demo["question"], user_id="demo", max_tokens=500))
    out.append(call("search", "peanut allergy", user_id="demo", limit=5))
    out.append(call("tree", user_id="demo"))
    topics = call("topics", user_id="demo")
    out.append(topics)
    leaf = next(t for t in topics if t.kind == "topic")
    out.append(call("topic", leaf.id, user_id="demo"))
    out.append(call("topic_detail", leaf.id, user_id="demo"))
    out.append(call("organize", "demo"))
    out.append(call("llm_log"))
    return out


def scenario_documents_and_deletion(call: Call) -> list[Any]:
    text = "\n\n".join(f"Section {i}. " + " ".join(f"Rule {i}.{j}: water the fern weekly." for j in range(15))
                       for i in range(4))
    out = [call("add_document", text, source="plants.md", user_id="d", at="2024-05-01T00:00:00Z")]
    out.append(call("add_document", text, source="plants.md", user_id="d", at="2024-05-01T00:00:00Z"))
    first = call("exchanges", user_id="d")[0]
    call("delete", first.id)
    out.append(call("exchanges", user_id="d"))
    out.append(call("recall", "how often do I water the fern?", user_id="d", max_tokens=300))
    leaf = next(t for t in call("topics", user_id="d") if t.kind == "topic")
    out.append(call("forget_topic", leaf.id, user_id="d", dry_run=True))
    out.append(call("forget_topic", leaf.id, user_id="d", confirm=True))
    with pytest.raises(NotFoundError):
        call("forget_topic", leaf.id, user_id="d")
    out.append(call("exchanges", user_id="d"))
    out.append(call("delete_user", "d"))
    out.append(call("stats", user_id="d"))
    return out


SCENARIOS = {
    "lifecycle": lambda call, demo: scenario_lifecycle(call),
    "bulk_recall_tree": scenario_bulk_recall_tree,
    "documents_and_deletion": lambda call, demo: scenario_documents_and_deletion(call),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_same_scenario_same_results(name: str, tmp_path: Path, demo_data: dict[str, Any]) -> None:
    scenario = SCENARIOS[name]
    with Memory(tmp_path / "sync.db", embedder="hash") as mem:
        sync_out = scenario(lambda method, *a, **k: getattr(mem, method)(*a, **k), demo_data)

    loop = asyncio.new_event_loop()
    try:
        amem = AsyncMemory(tmp_path / "async.db", embedder="hash")

        def acall(method: str, *a: Any, **k: Any) -> Any:
            coro = getattr(amem, method)(*a, **k)
            assert inspect.iscoroutine(coro)
            return loop.run_until_complete(coro)

        async_out = scenario(acall, demo_data)
        loop.run_until_complete(amem.close())
    finally:
        loop.close()
    assert len(sync_out) == len(async_out)
    for i, (s, a) in enumerate(zip(sync_out, async_out, strict=True)):
        assert normalise(s) == normalise(a), f"{name}: result {i} differs"


def test_every_public_method_is_async_with_the_same_signature() -> None:
    public = {n for n, v in vars(Memory).items() if not n.startswith("_") and callable(v)}
    assert {"begin", "complete", "fail", "add", "add_many", "add_document", "recall", "search",
            "tree", "topics", "delete_user"} <= public
    for name in public - {"close"}:
        fn = getattr(AsyncMemory, name)
        assert inspect.iscoroutinefunction(fn), name
        assert inspect.signature(fn) == inspect.signature(getattr(Memory, name)), name
    assert inspect.iscoroutinefunction(AsyncMemory.close)


def test_async_calls_do_not_block_the_event_loop(tmp_path: Path) -> None:
    def slow(texts: list[str]) -> np.ndarray:
        time.sleep(0.4)  # a slow embedding model
        return np.array([[len(t) % 7 + 1.0, 1.0, 2.0] for t in texts], dtype=np.float32)

    async def main() -> int:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.02)
                ticks += 1

        async with AsyncMemory(tmp_path / "m.db", embedder=CallableEmbedder(slow, dim=3)) as mem:
            task = asyncio.create_task(ticker())
            done = await asyncio.gather(*(mem.add(chat(f"note {i}", "ok"), user_id=f"u{i}") for i in range(3)))
            task.cancel()
            assert [d.user_id for d in done] == ["u0", "u1", "u2"]
        return ticks

    assert asyncio.run(main()) >= 10


def test_wraps_an_existing_memory(tmp_path: Path) -> None:
    from arbormem import ConfigError

    with Memory(tmp_path / "m.db", embedder="hash") as mem:
        amem = AsyncMemory(memory=mem)
        ex = asyncio.run(amem.add(chat("shared core", "yes"), user_id="u"))
        assert mem.get(ex.id) == ex
        with pytest.raises(ConfigError):
            AsyncMemory(tmp_path / "x.db", memory=mem)


def test_type_checkers_see_async_signatures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """mypy sees each method as a coroutine with Memory's parameters and result type."""
    mypy = pytest.importorskip("mypy.api")
    import arbormem

    # Point mypy at the source tree (the installed package carries no py.typed marker).
    monkeypatch.setenv("MYPYPATH", str(Path(arbormem.__file__).resolve().parents[1]))
    src = tmp_path / "use_async.py"
    src.write_text(
        "from arbormem import AsyncMemory\n"
        "async def f(m: AsyncMemory) -> None:\n"
        "    r = await m.recall('x', user_id='u', max_tokens=10)\n"
        "    reveal_type(r)\n"
        "    await m.recall(3, user_id='u')\n", encoding="utf-8")
    out, _, _ = mypy.run([str(src), "--no-incremental", "--ignore-missing-imports"])
    assert 'Revealed type is "arbormem.models.Recall"' in out
    assert 'Argument 1 has incompatible type "int"; expected "str"' in out

"""Each framework integration with the real framework package."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from arbormem import Memory

from .conftest import seed


@pytest.fixture
def mem(tmp_path: Path):
    with Memory(tmp_path / "int.db", embedder="hash") as m:
        seed(m)
        yield m


# -- LangGraph ----------------------------------------------------------------------------------
def _view(item: Any) -> tuple[tuple[str, ...], str, dict[str, Any]] | None:
    return None if item is None else (tuple(item.namespace), item.key, item.value)


def test_langgraph_store_keeps_the_callers_namespaces_like_in_memory_store(mem: Memory) -> None:
    """The BaseStore contract: the same operations on ArbormemStore and LangGraph's own
    InMemoryStore give the same items, namespaces and listings."""
    pytest.importorskip("langgraph")
    from langgraph.store.base import BaseStore
    from langgraph.store.memory import InMemoryStore

    from arbormem.errors import ValidationError
    from arbormem.integrations.langgraph import ArbormemStore

    ours, ref = ArbormemStore(mem, "alice"), InMemoryStore()
    assert isinstance(ours, BaseStore)
    ops = [
        (("prefs",), "diet", {"content": "Alice is vegetarian and avoids mushrooms.", "kind": "pref"}),
        (("prefs",), "seat", {"content": "Alice prefers window seats on trains.", "kind": "pref"}),
        (("prefs", "travel"), "seat", {"content": "On planes Alice takes the aisle.", "kind": "pref"}),
        (("notes", "2024"), "n1", {"text": "Booked the ryokan in Kyoto for October."}),
        (("memories", "alice"), "diet", {"memory": "Unrelated key clash in another namespace."}),
    ]
    for store in (ours, ref):
        for ns, key, value in ops:
            store.put(ns, key, value)
    for ns, key, _ in ops:
        assert _view(ours.get(ns, key)) == _view(ref.get(ns, key))
    assert ours.get(("prefs",), "nope") is None and ours.get(("other",), "diet") is None
    assert ours.list_namespaces() == sorted(ref.list_namespaces())
    for kwargs in ({"prefix": ("prefs",)}, {"suffix": ("alice",)}, {"max_depth": 1}):
        assert sorted(ours.list_namespaces(**kwargs)) == sorted(ref.list_namespaces(**kwargs)), kwargs

    def listing(store: Any, *args: Any, **kwargs: Any) -> list[Any]:
        return sorted((_view(i) for i in store.search(*args, **kwargs)), key=repr)

    for args, kwargs in ((((),), {}), ((("prefs",),), {}), ((("prefs",),), {"filter": {"kind": "pref"}}),
                         ((("prefs", "travel"),), {}), ((("nothing",),), {})):
        assert listing(ours, *args, **kwargs) == listing(ref, *args, **kwargs), (args, kwargs)

    # The case: put under ("prefs",), then search it with a query.
    hits = ours.search(("prefs",), query="what does alice eat? vegetarian food", limit=5)
    assert [h.key for h in hits][:1] == ["diet"] and hits[0].namespace == ("prefs",)
    assert all(h.namespace[:1] == ("prefs",) and h.score is not None for h in hits)
    assert len(ours.search(("prefs",), query="seats", limit=1, offset=1)) == 1

    # Replace and delete by (namespace, key); the same key elsewhere is untouched.
    for store in (ours, ref):
        store.put(("prefs",), "diet", {"content": "Alice is vegan now."})
        store.delete(("memories", "alice"), "diet")
    assert _view(ours.get(("prefs",), "diet")) == _view(ref.get(("prefs",), "diet"))
    assert ours.get(("memories", "alice"), "diet") is None
    assert sum("vegetarian" in e.user_text or "vegan" in e.user_text for e in mem.exchanges(user_id="alice")) == 1
    with pytest.raises(ValidationError):
        ours.put(("prefs",), "bad", "not a dict")  # type: ignore[arg-type]

    # The topic tree as an extra view: namespaces are topic paths, every exchange an item.
    tree = ours.tree_view()
    spaces = tree.list_namespaces()
    paths = {tuple(t.path) for t in mem.topics(user_id="alice") if t.kind == "topic"}
    assert set(spaces) == {tuple(p.replace(".", "\u2024") for p in path) for path in paths}
    assert set(tree.list_namespaces(max_depth=1)) == {ns[:1] for ns in spaces}
    vegan = tree.get((), "diet")
    assert vegan is not None and vegan.namespace in spaces and vegan.value == {"content": "Alice is vegan now."}
    peanuts = tree.search((), query="peanuts allergic Leo", limit=1)[0]
    assert "peanuts" in peanuts.value["user"] and tree.get((), peanuts.key).value == peanuts.value
    branch = tree.search(vegan.namespace[:1], query="vegan")
    assert branch and all(h.namespace[:1] == vegan.namespace[:1] for h in branch)

    # Isolation: alice's store never sees carol's items, in either view.
    carol_x = mem.exchanges(user_id="carol")[0].id
    assert tree.get((), carol_x) is None
    assert all("7431" not in json.dumps(h.value) for h in tree.search((), query="vault code", limit=50))
    assert ArbormemStore(mem, "carol").search(()) == []


def test_langgraph_store_async_and_in_a_graph(mem: Memory) -> None:
    pytest.importorskip("langgraph")
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph
    from langgraph.store.base import BaseStore

    from arbormem.integrations.langgraph import ArbormemStore

    store = ArbormemStore(mem, "alice")

    class State(TypedDict):
        question: str
        answer: str

    def remember_and_recall(state: State, *, store: BaseStore) -> dict[str, Any]:
        store.put(("notes",), "q", {"content": state["question"]})
        hits = store.search(("notes",), query="party", limit=1)
        return {"answer": hits[0].value["content"]}

    graph = StateGraph(State)
    graph.add_node("mem", remember_and_recall)
    graph.add_edge(START, "mem")
    graph.add_edge("mem", END)
    app = graph.compile(store=store)
    out = app.invoke({"question": "Where is Maya's party?", "answer": ""})
    assert out["answer"] == "Where is Maya's party?"
    assert store.get(("notes",), "q").value == {"content": "Where is Maya's party?"}

    async def run() -> None:
        await store.aput(("notes",), "a1", {"content": "Async note about kayaks."})
        item = await store.aget(("notes",), "a1")
        assert item is not None and item.value["content"].startswith("Async note")
        found = await store.asearch(("notes",), query="kayaks", limit=1)
        assert found[0].key == "a1"
        assert await store.alist_namespaces() == [("notes",)]
        await store.adelete(("notes",), "a1")
        assert await store.aget(("notes",), "a1") is None

    asyncio.run(run())


# -- LangChain ----------------------------------------------------------------------------------
def test_langchain_tools(mem: Memory) -> None:
    pytest.importorskip("langchain_core")
    from langchain_core.tools import BaseTool
    from langchain_core.utils.function_calling import convert_to_openai_tool

    from arbormem.integrations.langchain import memory_tools

    tools = {t.name: t for t in memory_tools(mem, "alice")}
    assert set(tools) == {"get_memory_index", "read_memory_node", "search_memory"}
    assert all(isinstance(t, BaseTool) for t in tools.values())
    schema = convert_to_openai_tool(tools["read_memory_node"])["function"]
    assert schema["parameters"]["required"] == ["node_id"] and "depth" in schema["parameters"]["properties"]

    index = tools["get_memory_index"].invoke({})
    assert index.startswith("Memory index") and "exchanges" in index
    leaf = next(t for t in mem.topics(user_id="alice") if t.kind == "topic")
    assert f"[{leaf.id}]" in index
    depth0 = tools["read_memory_node"].invoke({"node_id": leaf.id})
    assert leaf.title in depth0 and "summary:" in depth0 and "user:" not in depth0
    depth2 = tools["read_memory_node"].invoke({"node_id": leaf.id, "depth": 2})
    assert "detail (extractive)" in depth2 and "user:" in depth2
    found = tools["search_memory"].invoke({"query": "chocolate cake", "limit": 2})
    assert found.startswith("1. [") and "chocolate cake" in found

    carol_t = next(t.id for t in mem.topics(user_id="carol") if t.kind == "topic")
    assert tools["read_memory_node"].invoke({"node_id": carol_t}).startswith("error: not_found")
    assert "7431" not in tools["search_memory"].invoke({"query": "vault code", "limit": 20})
    assert "cello" not in index.lower()


def test_langchain_index_is_paged_by_tokens(tmp_path: Path, demo_data: dict[str, Any]) -> None:
    pytest.importorskip("langchain_core")
    from arbormem.integrations.langchain import memory_index, memory_tools

    with Memory(tmp_path / "big.db", embedder="hash") as mem:
        for i in range(4):  # the demo four times over: well over one page of nodes
            mem.add_many([{**x, "session_id": f"{x.get('session_id')}-{i}"} for x in demo_data["exchanges"]],
                         user_id="u")
        nodes = [t for t in mem.topics(user_id="u")]
        pages, offset = [], 0
        while True:
            page = memory_index(mem, "u", offset=offset, max_tokens=300)
            assert mem.tokens.count(page) <= 300
            pages.append(page)
            listed = [line for line in page.splitlines() if line.lstrip().startswith("- [")]
            offset += len(listed)
            if "for more)" not in page:
                break
            assert f"offset={offset}" in page
        assert len(pages) > 1 and offset == len(nodes)
        seen = "\n".join(pages)
        assert all(f"[{t.id}]" in seen for t in nodes)
        tool = {t.name: t for t in memory_tools(mem, "u")}["get_memory_index"]
        assert mem.tokens.count(tool.invoke({})) <= 1500
        assert tool.invoke({"offset": -1}).startswith("error: invalid_input")


# -- OpenAI Agents ------------------------------------------------------------------------------
def test_openai_agents_session_protocol(mem: Memory) -> None:
    pytest.importorskip("agents")
    from agents.memory.session import Session

    from arbormem.integrations.openai_agents import ArbormemSession

    s = ArbormemSession(mem, "alice", "agents-1")
    assert isinstance(s, Session) and s.session_id == "agents-1"

    async def run() -> None:
        assert await s.get_items() == []
        user = {"role": "user", "content": "What's the weather in Kyoto?"}
        call = {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city": "Kyoto"}'}
        out = {"type": "function_call_output", "call_id": "c1", "output": "sunny, 21C"}
        reply = {"type": "message", "role": "assistant", "id": "m1", "status": "completed",
                 "content": [{"type": "output_text", "text": "Sunny and 21C in Kyoto.", "annotations": []}]}
        await s.add_items([user])  # the SDK saves the input first...
        assert mem.exchanges(user_id="alice")[-1].status == "pending"
        await s.add_items([call, out, reply])  # ...then the turn's new items
        assert await s.get_items() == [user, call, out, reply]
        assert await s.get_items(limit=2) == [out, reply]
        last = mem.exchanges(user_id="alice")[-1]
        assert last.status == "completed" and "Sunny and 21C" in last.assistant_text
        assert mem.search("weather Kyoto sunny", user_id="alice", limit=1)[0].exchange.id == last.id

        second = [{"role": "user", "content": "And tomorrow?"},
                  {"role": "assistant", "content": "Rain is expected tomorrow."}]
        await s.add_items(second)
        assert await s.get_items() == [user, call, out, reply, *second]
        assert await s.pop_item() == second[1]
        assert await s.get_items() == [user, call, out, reply, second[0]]

        other = ArbormemSession(mem, "alice", "agents-2")
        await other.add_items([{"role": "user", "content": "Separate session"},
                               {"role": "assistant", "content": "ok"}])
        await s.clear_session()
        assert await s.get_items() == []
        assert len(await other.get_items()) == 2  # other sessions untouched
        ctx = await other.memory_context("peanuts for Leo", max_tokens=200)
        assert "peanuts" in ctx.text  # recall spans the user's whole memory
        carol = ArbormemSession(mem, "carol", "agents-2")
        assert await carol.get_items() == []  # same session id, other user: nothing

    asyncio.run(run())


def test_openai_agents_runner_keeps_history_in_arbormem(mem: Memory) -> None:
    pytest.importorskip("agents")
    from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
    from openai import AsyncOpenAI

    from arbormem.integrations.openai_agents import ArbormemSession
    from tests.support.openai_server import ScriptedOpenAIServer, answer

    set_tracing_disabled(True)
    with ScriptedOpenAIServer() as server:
        server.script(answer("Hello Alice! Noted."), answer("You told me your name is Alice."))
        client = AsyncOpenAI(base_url=server.url, api_key="sk-test", max_retries=0)
        agent = Agent(name="assistant", instructions="Be brief.",
                      model=OpenAIChatCompletionsModel(model="test-model", openai_client=client))
        session = ArbormemSession(mem, "alice", "run-1")

        async def run() -> list[Any]:
            r1 = await Runner.run(agent, "Hi, my name is Alice.", session=session)
            r2 = await Runner.run(agent, "What is my name?", session=session)
            assert r1.final_output == "Hello Alice! Noted." and r2.final_output.startswith("You told me")
            return await session.get_items()

        items = asyncio.run(run())
        second_request = server.chat_requests[1].body["messages"]
        assert any(m.get("content") == "Hi, my name is Alice." for m in second_request)  # history sent
        assert any("Hello Alice" in json.dumps(m) for m in second_request)
    texts = [json.dumps(i) for i in items]
    assert "Hi, my name is Alice." in texts[0] and any("You told me" in t for t in texts)
    stored = [e for e in mem.exchanges(user_id="alice") if e.session_id == "run-1"]
    assert [e.status for e in stored] == ["completed", "completed"]
    assert stored[0].user_text == "Hi, my name is Alice." and "Hello Alice" in stored[0].assistant_text

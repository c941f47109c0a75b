"""Adapters for agent frameworks, each an optional extra imported only when used:

- ``langgraph.ArbormemStore``: a LangGraph ``BaseStore`` whose namespaces are topic paths;
- ``langchain.memory_tools``: CoMeT-style index / read / search tools for LangChain agents;
- ``openai_agents.ArbormemSession``: an OpenAI Agents SDK ``Session`` kept in arbormem.
"""

"""Agents: who they are, what they are defined to do, and how one step of a run happens.

- `AgentRegistry` — the agents themselves: create, list, read, delete (`registry.py`);
- `AgentVersions` — an agent's definitions over time: one draft, frozen published versions
  (`versions.py`), each an `AgentDefinition` parsed whole or not at all (`definition.py`);
- `ModelClient` — one chat-completions call against the agent's model endpoint (`model.py`);
- `ToolSet` and `SandboxTools` — the tools' schemas and their execution in the sandbox;
  `BrowserTool` — the browser tool's calls to the sandbox's one browser (`browser_tool.py`,
  the agent's `browser:` block in `browser_settings.py`); `DocumentsTool` — the documents
  tool's calls to the worker in the sandbox (`documents_tool.py`, `documents_schema.py`);
  `RagTool` — `search` over the run's granted knowledge bases (`rag_tool.py`);
  `run_loop` — model, tools, observations until an answer or a limit (`loop.py`), and
  `replay` — where an interrupted run's loop stood, from its stored steps (`loop_replay.py`);
- `guest_scripts` — the small programs tools run inside the guest; `local_model` — the
  optional air-gapped model server (`aamp model serve`).

Names load on first use (`aamp.surface`): reading a definition loads no model client.
"""

from aamp.surface import surface

__all__, __getattr__ = surface(
    __name__,
    """
    browser_tool: BrowserTool
    documents_tool: DocumentsTool
    rag_tool: RagTool rag_index_path
    definition: AgentDefinition DefinitionError Limits ModelConfig definition_from_dict
        endpoint_problems parse_definition stored_form
    loop: LoopOutcome run_loop summarise
    loop_replay: LoopState NotResumable replay
    model: EndpointAccess ModelClient ModelError ModelReply
    registry: AgentInfo AgentRegistry
    sandbox_tools: Observation SandboxTools
    tools: ToolSet truncate
    versions: AgentVersion AgentVersions missing_version
    """,
    modules=("guest_scripts", "local_model"),
)

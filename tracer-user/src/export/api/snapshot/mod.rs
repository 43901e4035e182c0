//! `AgentSnapshot` ⇄ `gputracer.v1.Snapshot`, and the agent's status as `gputracer.v1.AgentStatus`.

//! The model on the wire: decoded events as `gputracer.v1.Event`s ([`events`]), the snapshot and the
//! agent's status as `gputracer.v1.Snapshot` / `AgentStatus` and back ([`snapshot`]); the event
//! filters are [`crate::filter`] (the config reads them too). Pure functions of the
//! model and the messages: the agent serves them, the clients read them back.
pub mod events;
pub mod snapshot;

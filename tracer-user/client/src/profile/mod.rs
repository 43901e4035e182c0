//! A profiling session's outputs: the Perfetto trace ([`perfetto`]), the summary ([`summary`]),
//! the HTML report ([`html`]), where they are written and the progress shown ([`output`]), and a
//! session recorded by a running agent ([`remote`], `profile --connect`). The recording itself is
//! `tracer_core::profile`'s.
pub mod html;
pub mod intervals;
pub mod output;
pub mod perfetto;
pub mod remote;
pub mod summary;

#[cfg(test)]
mod tests;

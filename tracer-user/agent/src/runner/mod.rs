//! The loop every long-running command shares (`top`, `agent`, and `events`): step the agent
//! (events go to [`Handler::event`]), tick on a schedule ([`Handler::tick`]: drain, snapshot,
//! print or publish), and stop on Ctrl-C or SIGTERM, when the duration is up, or when the handler
//! says so. The agent is left as it is when the loop returns, for the caller's final drain.
//!
//! Signals are [`tracer_core::stop`]'s: the command installs it (with its grace period) before the
//! loop; without it only the duration and the handler stop the loop.
use std::time::{Duration, Instant};

use crate::pipeline::Agent;
use tracer_core::{decode::Event, model::EventContext, stop};

/// Whether the loop goes on after a tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

/// Why [`run`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// SIGINT (Ctrl-C) or SIGTERM.
    Signal,
    /// [`Schedule::duration`] passed.
    Duration,
    /// The handler's [`Handler::tick`] returned [`Flow::Stop`] or its [`Handler::should_stop`]
    /// said so.
    Handler,
}

/// When the loop ticks and for how long it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Time between ticks. Ticks keep to a fixed rate (start + k × interval); a loop more than
    /// one interval late skips the missed ticks instead of running them back to back.
    pub interval: Duration,
    /// Tick after the first step instead of after the first interval.
    pub tick_at_start: bool,
    /// Stop once this much time has passed since the loop started (checked after every step).
    pub duration: Option<Duration>,
}

impl Schedule {
    /// A `--duration` in seconds as a limit: negative is "stop after the first step", and
    /// infinite, NaN or beyond what a [`Duration`] holds is "no limit".
    pub fn duration_from_secs(secs: f64) -> Option<Duration> {
        if secs.is_nan() {
            return None;
        }
        Duration::try_from_secs_f64(secs.max(0.0)).ok()
    }
}

/// What a command does with the loop. Every method but [`Handler::tick`] has a do-nothing default.
pub trait Handler {
    /// What a tick can fail with (the command's own error; it must hold an I/O error, for the
    /// signal handler's registration).
    type Error: From<std::io::Error>;
    /// Each event, as the agent applies it.
    fn event(&mut self, _ev: &Event, _ctx: &EventContext) {}
    /// After every step (every few milliseconds): cheap work such as a liveness heartbeat.
    fn stepped(&mut self, _agent: &mut Agent) {}
    /// Every [`Schedule::interval`]: drain, snapshot, and print or publish.
    fn tick(&mut self, agent: &mut Agent) -> Result<Flow, Self::Error>;
    /// Checked after every step and tick: stop now (an output limit reached, a write failed).
    fn should_stop(&self) -> bool {
        false
    }
}

/// Run the loop until a signal, the duration, or the handler stops it. Errors: registering the
/// SIGUSR1 handler, or one returned by [`Handler::tick`].
pub async fn run<H: Handler>(agent: &mut Agent, schedule: Schedule, handler: &mut H) -> Result<Stopped, H::Error> {
    let start = Instant::now();
    let mut next = if schedule.tick_at_start { start } else { start + schedule.interval };
    // SIGUSR1 switches the kernel-side diagnostics (`kernel_log`) on and off.
    let mut usr1 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())?;
    loop {
        let mut toggle = false;
        {
            let mut sink = |ev: &Event, ctx: &EventContext| handler.event(ev, ctx);
            tokio::select! {
                _ = agent.step(&mut sink) => {}
                // Level-triggered: a signal that came while this loop was elsewhere (a tick, the
                // handler) is seen here the next time round, never lost (tracer_core::stop).
                _ = stop::wait() => return Ok(Stopped::Signal),
                _ = usr1.recv() => toggle = true,
            }
        }
        if toggle {
            agent.toggle_kernel_log();
        }
        handler.stepped(agent);
        let now = Instant::now();
        if now >= next {
            next = next_tick(next, now, schedule.interval);
            if handler.tick(agent)? == Flow::Stop {
                return Ok(Stopped::Handler);
            }
        }
        if handler.should_stop() {
            return Ok(Stopped::Handler);
        }
        if stop::requested() {
            return Ok(Stopped::Signal);
        }
        if schedule.duration.is_some_and(|d| start.elapsed() >= d) {
            return Ok(Stopped::Duration);
        }
    }
}

/// The tick after the one due at `due`, handled at `now`: one interval on, or one interval from
/// now when that is already past.
fn next_tick(due: Instant, now: Instant, interval: Duration) -> Instant {
    let next = due + interval;
    if next <= now { now + interval } else { next }
}

#[cfg(test)]
mod tests;

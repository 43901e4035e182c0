//! The process's stop request: SIGINT (Ctrl-C) and SIGTERM as a flag that, once set, stays set.
//!
//! A future made per loop iteration (tokio's `ctrl_c()` was) sees only signals that arrive while it
//! exists: one that lands while the loop is busy elsewhere is lost, and the command runs on (an
//! `events --json` went on for 200 s after Ctrl-C). Here the signal handler itself records the
//! signal (an atomic counter, nothing else but a `write(2)` to wake the watcher), so [`requested`]
//! is true from that instant on and [`wait`] completes whenever it is polled, however late.
//!
//! The stop is also bounded: [`install`] takes a grace period; a watcher thread, woken by the
//! handler, wakes every waiting task and, if the process is still running when the grace period
//! is over (a final drain that cannot finish under a flood, a write into a pipe nobody reads),
//! ends it with status 128 + the signal's number, saying so on stderr. A second signal ends the
//! process at once, from the handler. Runtime-free (std and libc): the futures work under any
//! executor; tokio is not needed to see a stop.
use std::{
    future::Future,
    pin::Pin,
    sync::{
        Mutex, Once,
        atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering},
    },
    task::{Context, Poll, Waker},
    time::Duration,
};

/// Signals received (SIGINT and SIGTERM together).
static RECEIVED: AtomicU32 = AtomicU32::new(0);
/// The first one's number.
static FIRST: AtomicI32 = AtomicI32::new(0);
/// The write end of the watcher's pipe (`-1` before [`install`]).
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
/// The grace period in milliseconds (the first [`install`]'s).
static GRACE_MS: AtomicU64 = AtomicU64::new(0);
/// Tasks waiting in [`wait`].
static WAKERS: Mutex<Vec<Waker>> = Mutex::new(Vec::new());
static INSTALL: Once = Once::new();

/// Registers the SIGINT and SIGTERM handlers and starts the watcher (once per process; later calls
/// do nothing, the first grace period stays). `grace`: how long after the first signal the process
/// may take to stop by itself. Errors: `sigaction`, `pipe2` or the thread failed (the message
/// names which).
pub fn install(grace: Duration) -> std::io::Result<()> {
    let mut result = Ok(());
    INSTALL.call_once(|| result = install_once(grace));
    result
}

fn install_once(grace: Duration) -> std::io::Result<()> {
    let named = |what: &str| {
        let e = std::io::Error::last_os_error();
        std::io::Error::new(e.kind(), format!("{what}: {e}"))
    };
    GRACE_MS.store(grace.as_millis().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(named("pipe2 for the signal watcher"));
    }
    // The read end blocks (the watcher sleeps in read); the write end stays non-blocking (the
    // handler must never block: one byte is enough, a full pipe already wakes the watcher).
    // SAFETY: fcntl on a descriptor this function owns.
    unsafe { libc::fcntl(fds[0], libc::F_SETFL, 0) };
    WAKE_FD.store(fds[1], Ordering::SeqCst);
    let read_fd = fds[0];
    std::thread::Builder::new()
        .name("stop-watcher".into())
        .spawn(move || watch(read_fd))
        .map_err(|e| std::io::Error::new(e.kind(), format!("starting the signal watcher thread: {e}")))?;
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is valid; the handler only does async-signal-safe work
        // (atomics, write, _exit).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                return Err(named("sigaction"));
            }
        }
    }
    Ok(())
}

extern "C" fn on_signal(sig: libc::c_int) {
    if RECEIVED.fetch_add(1, Ordering::SeqCst) == 0 {
        FIRST.store(sig, Ordering::SeqCst);
        let fd = WAKE_FD.load(Ordering::SeqCst);
        if fd >= 0 {
            // SAFETY: write(2) is async-signal-safe; a full pipe (EAGAIN) is fine.
            unsafe { libc::write(fd, [1u8].as_ptr().cast(), 1) };
        }
        return;
    }
    let msg = b"\ngpu-tracer: a second signal: stopping now, without finishing\n";
    // SAFETY: write(2) and _exit(2) are async-signal-safe.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::_exit(128 + sig);
    }
}

/// The watcher: wakes every waiting task at the first signal, then ends the process if it is
/// still running when the grace period is over.
fn watch(fd: i32) {
    let mut b = [0u8; 16];
    loop {
        // SAFETY: reads into a local buffer.
        let n = unsafe { libc::read(fd, b.as_mut_ptr().cast(), b.len()) };
        if n > 0 || RECEIVED.load(Ordering::SeqCst) > 0 {
            break;
        }
        if n == 0 {
            return;
        }
    }
    wake_all();
    let grace = Duration::from_millis(GRACE_MS.load(Ordering::Relaxed));
    std::thread::sleep(grace);
    let sig = FIRST.load(Ordering::SeqCst);
    let msg = format!(
        "\ngpu-tracer: still running {:.1} s after {}: stopping now, without finishing\n",
        grace.as_secs_f64(),
        signal_name(sig)
    );
    // SAFETY: a plain write of a local buffer (not eprintln!, which panics when stderr is closed),
    // then _exit, which ends the process without running destructors or flushing buffers: the
    // normal path did not finish, and a flush could block the same way.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::_exit(128 + sig);
    }
}

fn wake_all() {
    let wakers = std::mem::take(&mut *WAKERS.lock().unwrap_or_else(|p| p.into_inner()));
    wakers.into_iter().for_each(Waker::wake);
}

/// `SIGINT` / `SIGTERM` / `signal N`.
pub fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        n => format!("signal {n}"),
    }
}

/// Has a stop been asked for (SIGINT or SIGTERM since [`install`])? Stays true once it is.
pub fn requested() -> bool {
    RECEIVED.load(Ordering::SeqCst) > 0
}

/// The first stop signal's name, once one came.
pub fn first_signal() -> Option<String> {
    requested().then(|| signal_name(FIRST.load(Ordering::SeqCst)))
}

/// Completes once a stop has been asked for; at once if it already has. Make one per loop
/// iteration freely: nothing is lost between them.
pub fn wait() -> Wait {
    Wait(())
}

/// The future of [`wait`].
#[must_use = "a future does nothing unless polled"]
pub struct Wait(());

impl Future for Wait {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if requested() {
            return Poll::Ready(());
        }
        {
            let mut w = WAKERS.lock().unwrap_or_else(|p| p.into_inner());
            if !w.iter().any(|k| k.will_wake(cx.waker())) {
                w.push(cx.waker().clone());
            }
        }
        // Checked again after registering: the watcher takes the wakers only after the flag is
        // set, so either this waker is woken or the flag is seen here.
        if requested() { Poll::Ready(()) } else { Poll::Pending }
    }
}

#[cfg(test)]
mod tests;

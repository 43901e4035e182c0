use super::*;
use std::{
    sync::{Arc, atomic::AtomicBool},
    task::Wake,
    thread::Thread,
};

/// A minimal executor: polls `f` on this thread, parking between wakes; gives up after `limit`.
fn block_on_for<F: Future>(f: F, limit: Duration) -> Option<F::Output> {
    struct Unpark(Thread, AtomicBool);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.1.store(true, Ordering::SeqCst);
            self.0.unpark();
        }
    }
    let w = Arc::new(Unpark(std::thread::current(), AtomicBool::new(false)));
    let waker = Waker::from(w.clone());
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    let until = std::time::Instant::now() + limit;
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return Some(v);
        }
        let now = std::time::Instant::now();
        if now >= until {
            return None;
        }
        std::thread::park_timeout(until - now);
    }
}

/// One test for the whole process-wide state (handlers, flag, watcher): a signal raised while
/// nobody waits is still seen by every later wait, a waiting task is woken by it, and a second
/// `install` keeps the first grace period. (The second signal's `_exit` and the grace period's are
/// checked against the real binary in tests/tests/signals.rs.)
#[test]
fn a_signal_is_a_flag_that_stays_set_and_wakes_waiters() {
    install(Duration::from_secs(3600)).unwrap();
    install(Duration::from_millis(1)).unwrap();
    assert_eq!(GRACE_MS.load(Ordering::Relaxed), 3_600_000);
    assert!(!requested());
    assert_eq!(first_signal(), None);
    // Nothing asked yet: a wait does not complete.
    assert!(block_on_for(wait(), Duration::from_millis(50)).is_none());
    // A waiter on another thread, parked in the wait when the signal comes.
    let waiter = std::thread::spawn(|| block_on_for(wait(), Duration::from_secs(30)).is_some());
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: sends SIGTERM to this process, whose handler is installed above.
    assert_eq!(unsafe { libc::kill(libc::getpid(), libc::SIGTERM) }, 0);
    assert!(waiter.join().unwrap(), "the waiting task was not woken");
    assert!(requested());
    assert_eq!(first_signal().as_deref(), Some("SIGTERM"));
    // Every later wait completes at once: the signal came while none of them existed.
    for _ in 0..3 {
        assert_eq!(block_on_for(wait(), Duration::ZERO), Some(()));
    }
}

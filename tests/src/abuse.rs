//! Client-side machinery of the endpoint abuse tests (tests/http_abuse.rs, tests/grpc_abuse.rs):
//! many non-blocking client sockets bound to chosen loopback addresses, driven with poll(2) from a
//! few threads, each remembering how and when the agent ended it; and the agent's RSS and open
//! file descriptors read from /proc.
use std::{
    io::{ErrorKind, Read, Write},
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream},
    os::fd::AsRawFd,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

/// The resident memory of process `pid` (VmRSS), in bytes; 0 when it is gone.
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

pub fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Peaks of the agent's RSS and fd count since the last [`Sampler::take`], sampled every 5 ms.
pub struct Sampler {
    peaks: Arc<Mutex<(u64, usize)>>,
    stop: Arc<AtomicBool>,
}

impl Sampler {
    pub fn start(pid: u32) -> Sampler {
        let peaks = Arc::new(Mutex::new((0, 0)));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (Arc::clone(&peaks), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let (rss, fds) = (rss_bytes(pid), fd_count(pid));
                let mut g = p.lock().unwrap();
                *g = (g.0.max(rss), g.1.max(fds));
                drop(g);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Sampler { peaks, stop }
    }

    /// (peak RSS, peak fds) since the last call.
    pub fn take(&self) -> (u64, usize) {
        std::mem::take(&mut *self.peaks.lock().unwrap())
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Raise this process's soft fd limit to at least `want`; panics where the hard limit is lower.
pub fn raise_nofile(want: u64) {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct passed.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    if lim.rlim_cur >= want {
        return;
    }
    assert!(lim.rlim_max >= want, "this test needs {want} fds; the hard RLIMIT_NOFILE is {}", lim.rlim_max);
    lim.rlim_cur = want;
    // SAFETY: setrlimit reads the struct passed.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0, "raise RLIMIT_NOFILE");
}

/// How a client connection ended.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ending {
    /// When the connection was opened.
    pub opened: Option<Instant>,
    /// Since the connection was opened.
    pub after: Option<Duration>,
    /// The agent answered something (e.g. 431) before closing.
    pub answered: Option<u16>,
}

/// What a client sends: `first` bytes of `bytes` at once, the rest once the connection has been
/// open for `rest_after`.
#[derive(Clone)]
pub struct Request {
    pub bytes: Vec<u8>,
    pub first: usize,
    pub rest_after: Duration,
}

impl Request {
    pub fn at_once(bytes: &[u8]) -> Request {
        Request { bytes: bytes.to_vec(), first: bytes.len(), rest_after: Duration::ZERO }
    }
}

/// A client socket, non-blocking, with what it still has to send.
pub struct Client {
    s: TcpStream,
    opened: Instant,
    request: Request,
    sent: usize,
    got: Vec<u8>,
    end: Ending,
}

impl Client {
    /// Connects from `from` (any 127/8 address reaches a server on 127.0.0.1).
    pub fn open(addr: SocketAddr, from: Ipv4Addr, request: Request) -> Client {
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("a socket");
        sock.bind(&SocketAddr::V4(SocketAddrV4::new(from, 0)).into())
            .unwrap_or_else(|e| panic!("bind a client socket to {from}: {e}"));
        sock.connect_timeout(&addr.into(), Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("connect to the agent at {addr} from {from}: {e}"));
        let s: TcpStream = sock.into();
        s.set_nonblocking(true).unwrap();
        let mut c = Client { s, opened: Instant::now(), request, sent: 0, got: Vec::new(), end: Ending::default() };
        c.send();
        c
    }

    pub fn closed(&self) -> bool {
        self.end.after.is_some()
    }

    fn close_now(&mut self) {
        if self.end.after.is_none() {
            self.end.opened = Some(self.opened);
            self.end.after = Some(self.opened.elapsed());
            self.end.answered = std::str::from_utf8(&self.got)
                .ok()
                .and_then(|r| r.strip_prefix("HTTP/1.1 "))
                .and_then(|r| r.get(..3))
                .and_then(|c| c.parse().ok());
        }
    }

    /// How much of the request may be sent by now.
    fn due(&self) -> usize {
        if self.opened.elapsed() >= self.request.rest_after { self.request.bytes.len() } else { self.request.first }
    }

    /// Send what the socket takes; a reset or broken pipe means the agent closed it.
    fn send(&mut self) {
        let due = self.due();
        while self.sent < due && !self.closed() {
            match self.s.write(&self.request.bytes[self.sent..due]) {
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => self.close_now(),
            }
        }
    }

    /// Read what the agent sent; end of stream or an error means it closed the connection.
    fn receive(&mut self) {
        let mut buf = [0u8; 4096];
        while !self.closed() {
            match self.s.read(&mut buf) {
                Ok(0) => self.close_now(),
                Ok(n) => self.got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => self.close_now(),
            }
        }
    }
}

/// Drive `clients` (send, receive, notice closes) until all are closed or `deadline` passes.
pub fn drive(clients: &mut [Client], deadline: Instant) {
    while Instant::now() < deadline {
        let open: Vec<usize> = (0..clients.len()).filter(|&i| !clients[i].closed()).collect();
        if open.is_empty() {
            return;
        }
        let mut pfds: Vec<libc::pollfd> = open
            .iter()
            .map(|&i| {
                let c = &clients[i];
                let mut events = libc::POLLIN | libc::POLLRDHUP;
                if c.sent < c.due() {
                    events |= libc::POLLOUT;
                }
                libc::pollfd { fd: c.s.as_raw_fd(), events, revents: 0 }
            })
            .collect();
        let wait = deadline.saturating_duration_since(Instant::now()).as_millis().min(20) as libc::c_int;
        // SAFETY: `pfds` is a valid array of `pfds.len()` pollfd structs.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, wait) };
        if n <= 0 {
            continue;
        }
        for (p, &i) in pfds.iter().zip(&open) {
            if p.revents == 0 {
                continue;
            }
            let c = &mut clients[i];
            if p.revents & libc::POLLOUT != 0 {
                c.send();
            }
            c.receive();
        }
    }
}

/// Wait until the agent's fd count is at most `want` (within `timeout`); the count then.
pub fn fds_settle(pid: u32, want: usize, timeout: Duration) -> usize {
    let t = Instant::now();
    loop {
        let n = fd_count(pid);
        if n <= want || t.elapsed() >= timeout {
            return n;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Open `n` connections from `threads` threads at once (thread `w` from `from[w % from.len()]`),
/// each sending `request` and then holding on until the agent closes it, or until `hold` after its
/// thread's last open: how each ended, and when the last one was opened.
pub fn burst(
    addr: SocketAddr,
    from: &[Ipv4Addr],
    n: usize,
    threads: usize,
    request: &Request,
    hold: Duration,
) -> (Vec<Ending>, Instant) {
    let workers: Vec<_> = (0..threads)
        .map(|w| {
            let request = request.clone();
            let from = from[w % from.len()];
            let count = n / threads + usize::from(w < n % threads);
            std::thread::spawn(move || {
                let mut clients: Vec<Client> = Vec::with_capacity(count);
                for i in 0..count {
                    clients.push(Client::open(addr, from, request.clone()));
                    if i % 25 == 24 {
                        // Notice closes as they happen, so each connection's lifetime is right.
                        drive(&mut clients, Instant::now() + Duration::from_millis(1));
                    }
                }
                let last_open = Instant::now();
                drive(&mut clients, last_open + hold);
                (clients.iter().map(|c| c.end).collect::<Vec<_>>(), last_open)
            })
        })
        .collect();
    let mut endings = Vec::with_capacity(n);
    let mut last_open = Instant::now();
    for (i, w) in workers.into_iter().enumerate() {
        let (e, t) = w.join().expect("a client thread");
        endings.extend(e);
        last_open = if i == 0 { t } else { last_open.max(t) };
    }
    (endings, last_open)
}

/// The most connections among `endings` held (open at least `held_from`) at the same moment.
pub fn most_at_once(endings: &[Ending], held_from: Duration) -> usize {
    let mut edges: Vec<(Instant, i32)> = endings
        .iter()
        .filter_map(|e| Some((e.opened?, e.after?)))
        .filter(|(_, d)| *d >= held_from)
        .flat_map(|(t, d)| [(t, 1), (t + d, -1)])
        .collect();
    // At one instant a close comes before an open.
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    most as usize
}

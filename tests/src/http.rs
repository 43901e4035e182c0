//! A small HTTP/1.1 client for the root tests: one request per connection, the connection closed
//! by the server after the answer. Never panics: status 0 when there was no answer (refused,
//! closed without a word, or timed out), so a test can assert on refusals as on answers.
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// How long a connect and each read may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// `GET path` on `addr` (`host:port`): (status, body).
pub fn get(addr: impl std::fmt::Display, path: &str) -> (u16, String) {
    let addr = addr.to_string();
    request(&addr, &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"))
}

/// `POST path` with an `application/x-www-form-urlencoded` body (e.g. a Prometheus API query):
/// (status, body).
pub fn post_form(addr: impl std::fmt::Display, path: &str, form: &[(&str, &str)]) -> (u16, String) {
    let addr = addr.to_string();
    let body = form.iter().map(|(k, v)| format!("{}={}", encode(k), encode(v))).collect::<Vec<_>>().join("&");
    request(
        &addr,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
}

/// Percent-encoding of a form value (RFC 3986 unreserved characters kept).
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn request(addr: &str, req: &str) -> (u16, String) {
    let Some(sock) = addr.to_socket_addrs().ok().and_then(|mut a| a.next()) else { return (0, String::new()) };
    let timeout = crate::scaled(TIMEOUT);
    let Ok(mut s) = TcpStream::connect_timeout(&sock, timeout) else { return (0, String::new()) };
    let _ = s.set_read_timeout(Some(timeout));
    if s.write_all(req.as_bytes()).is_err() {
        return (0, String::new());
    }
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let raw = String::from_utf8_lossy(&raw);
    let status = raw.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let Some((head, body)) = raw.split_once("\r\n\r\n") else { return (status, String::new()) };
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    (status, if chunked { dechunk(body) } else { body.to_string() })
}

/// The body of a `Transfer-Encoding: chunked` answer (what arrived of it).
fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16) else { break };
        if n == 0 || after.len() < n {
            out.push_str(&after[..n.min(after.len())]);
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].strip_prefix("\r\n").unwrap_or(&after[n..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_are_joined_and_form_values_encoded() {
        assert_eq!(dechunk("5\r\nhello\r\n7;x=1\r\n, world\r\n0\r\n\r\n"), "hello, world");
        assert_eq!(encode("sum by (gpu) (x{a=\"b\"})"), "sum%20by%20%28gpu%29%20%28x%7Ba%3D%22b%22%7D%29");
    }
}

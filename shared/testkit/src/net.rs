//! Loopback plumbing: free ports, the client readiness probe, and HTTP GET for monitoring.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// Address every test server listens on.
pub(crate) const HOST: Ipv4Addr = Ipv4Addr::LOCALHOST;

const CONNECT_TIMEOUT: Duration = Duration::from_millis(250);
const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// `count` distinct ports that were free a moment ago.
///
/// All listeners are held until every port is picked, so the ports differ from each other; they
/// are released before returning, so another process may take one first. Callers retry on
/// "address already in use".
pub(crate) fn free_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..count)
        .map(|_| TcpListener::bind((HOST, 0)).expect("bind a free port on 127.0.0.1"))
        .collect();
    listeners
        .iter()
        .map(|listener| listener.local_addr().expect("bound address").port())
        .collect()
}

/// True once a NATS server on `port` greets a new connection with its `INFO` line, which it does
/// only after JetStream is up and the client listener accepts.
pub(crate) fn accepts_clients(port: u16) -> bool {
    let Ok(mut stream) =
        TcpStream::connect_timeout(&SocketAddr::from((HOST, port)), CONNECT_TIMEOUT)
    else {
        return false;
    };
    if stream.set_read_timeout(Some(IO_TIMEOUT)).is_err() {
        return false;
    }
    let mut greeting = Vec::new();
    let mut chunk = [0u8; 1024];
    while !greeting.contains(&b'\n') && greeting.len() < 64 * 1024 {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => greeting.extend_from_slice(&chunk[..n]),
        }
    }
    greeting.starts_with(b"INFO ")
}

/// `GET path` on `127.0.0.1:port` over HTTP/1.0; returns the status code and the body.
pub(crate) fn http_get(port: u16, path: &str) -> io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&SocketAddr::from((HOST, port)), CONNECT_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {HOST}:{port}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;

    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no end of HTTP headers"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no HTTP status code"))?;
    Ok((status, body.to_owned()))
}

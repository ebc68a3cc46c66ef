//! A raw TCP server that takes uploads (a `Content-Length` or chunked
//! body), records each one, and resets the connection partway through the
//! ones it is told to.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// One upload as the server read it.
#[derive(Debug, Clone)]
pub struct Upload {
    pub method: String,
    pub key: Option<String>,
    /// The body bytes read (all of them, unless the server reset).
    pub body: Vec<u8>,
    /// The body was read to its end.
    pub complete: bool,
}

/// What the server does with the n-th upload (counted from 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Reset the connection once this many body bytes are read.
    ResetAfter(usize),
    /// Read the whole body, then answer with this status.
    Answer(u16),
}

/// The uploads the server has read, in order.
#[derive(Clone, Default)]
pub struct Uploads(Arc<Mutex<Vec<Upload>>>);

impl Uploads {
    pub fn all(&self) -> Vec<Upload> {
        self.0.lock().unwrap().clone()
    }
}

/// A server that follows `plans`, one per upload (the last one for the
/// rest), one upload per connection.
pub async fn upload_server(plans: Vec<Plan>) -> (SocketAddr, Uploads) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let uploads = Uploads::default();
    let seen = uploads.clone();
    tokio::spawn(async move {
        let mut n = 0;
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            let plan = plans[n.min(plans.len() - 1)];
            n += 1;
            tokio::spawn(serve(socket, plan, seen.clone()));
        }
    });
    (addr, uploads)
}

async fn serve(socket: TcpStream, plan: Plan, uploads: Uploads) {
    let mut reader = BufReader::new(socket);
    let mut line = String::new();
    if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
        return;
    }
    let method = line.split(' ').next().unwrap_or("").to_owned();
    let (mut length, mut chunked, mut key) = (None, false, None);
    loop {
        line.clear();
        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':').unwrap();
        let (name, value) = (name.to_ascii_lowercase(), value.trim().to_owned());
        match name.as_str() {
            "content-length" => length = value.parse::<usize>().ok(),
            "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
            "idempotency-key" => key = Some(value),
            _ => {}
        }
    }
    let stop = match plan {
        Plan::ResetAfter(n) => n,
        Plan::Answer(_) => usize::MAX,
    };
    let mut body = Vec::new();
    let complete = if chunked {
        read_chunked(&mut reader, &mut body, stop).await
    } else {
        let want = length.unwrap_or(0);
        read_up_to(&mut reader, &mut body, want.min(stop)).await && body.len() == want
    };
    uploads.0.lock().unwrap().push(Upload {
        method,
        key,
        body,
        complete,
    });
    let mut socket = reader.into_inner();
    match plan {
        Plan::ResetAfter(_) => {
            socket.set_zero_linger().unwrap();
            drop(socket);
        }
        Plan::Answer(status) => {
            let answer =
                format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            let _ = socket.write_all(answer.as_bytes()).await;
            let _ = socket.shutdown().await;
        }
    }
}

/// Reads body bytes until `body` holds `want`; false if the peer closed.
async fn read_up_to(reader: &mut BufReader<TcpStream>, body: &mut Vec<u8>, want: usize) -> bool {
    let mut buf = vec![0u8; 64 * 1024];
    while body.len() < want {
        let room = (want - body.len()).min(buf.len());
        match reader.read(&mut buf[..room]).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => body.extend_from_slice(&buf[..n]),
        }
    }
    true
}

/// Reads a chunked body, stopping once `stop` bytes are read; true if it
/// was read to its last chunk.
async fn read_chunked(reader: &mut BufReader<TcpStream>, body: &mut Vec<u8>, stop: usize) -> bool {
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
            return false;
        }
        let size = line.trim_end().split(';').next().unwrap_or("");
        let Ok(size) = usize::from_str_radix(size, 16) else {
            return false;
        };
        if size == 0 {
            // Trailers (none expected), then the empty line.
            loop {
                line.clear();
                if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                    return false;
                }
                if line.trim_end().is_empty() {
                    return true;
                }
            }
        }
        let want = body.len() + size;
        if !read_up_to(reader, body, want.min(stop)).await || body.len() >= stop {
            return false;
        }
        let mut crlf = [0u8; 2];
        if reader.read_exact(&mut crlf).await.is_err() {
            return false;
        }
    }
}

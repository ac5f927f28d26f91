//! A fault-injecting TCP proxy for the replication tests.
//!
//! Forwards every connection to `upstream` while healthy. [`Proxy::cut`]
//! stops moving bytes in both directions on every connection, old and new,
//! without closing anything: like a partition, the senders' buffers fill
//! and nothing arrives (the nodes' own timeouts must notice). [`Proxy::heal`]
//! lets bytes flow again; connections still open resume where they stopped.
//! [`Proxy::sever`] closes every open connection (new ones are forwarded).
//!
//! The listening socket has a small receive buffer (inherited by accepted
//! connections), so a cut backs up the sender after a few kilobytes instead
//! of the megabytes a loopback socket would otherwise absorb.

use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    pub addr: SocketAddr,
    flowing: watch::Sender<bool>,
    /// Bumped by `sever`: connections opened before it close.
    severed: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: &str) -> Proxy {
        let socket = TcpSocket::new_v4().expect("socket");
        socket
            .set_recv_buffer_size(4096)
            .expect("small receive buffer");
        socket.set_reuseaddr(true).expect("reuseaddr");
        socket.bind("127.0.0.1:0".parse().unwrap()).expect("bind");
        let listener = socket.listen(64).expect("listen");
        let addr = listener.local_addr().unwrap();
        let (flowing, watch) = watch::channel(true);
        let (severed, sever_rx) = watch::channel(0u64);
        let upstream = upstream.to_owned();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let (upstream, watch) = (upstream.clone(), watch.clone());
                let mut sever_rx = sever_rx.clone();
                sever_rx.borrow_and_update();
                tokio::spawn(async move {
                    let mut watch_up = watch.clone();
                    // A cut proxy does not even connect on; the client waits.
                    while !*watch_up.borrow_and_update() {
                        if watch_up.changed().await.is_err() {
                            return;
                        }
                    }
                    let Ok(server) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let a = tokio::spawn(pump(cr, sw, watch.clone()));
                    let b = tokio::spawn(pump(sr, cw, watch));
                    let (abort_a, abort_b) = (a.abort_handle(), b.abort_handle());
                    tokio::select! {
                        _ = async { let _ = tokio::join!(a, b); } => {}
                        _ = sever_rx.changed() => {
                            // Dropping both halves of both sockets closes them.
                            abort_a.abort();
                            abort_b.abort();
                        }
                    }
                });
            }
        });
        Proxy {
            addr,
            flowing,
            severed,
            task,
        }
    }

    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// Stops every byte, both ways, on every connection.
    pub fn cut(&self) {
        self.flowing.send_replace(false);
    }

    /// Lets bytes flow again.
    pub fn heal(&self) {
        self.flowing.send_replace(true);
    }

    /// Closes every connection open now.
    pub fn sever(&self) {
        self.severed.send_modify(|g| *g += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to` while the proxy is flowing; while it is cut, reads
/// nothing (so the sender's buffers fill, as across a partition).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut flowing: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        while !*flowing.borrow_and_update() {
            if flowing.changed().await.is_err() {
                return;
            }
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            // Cut while waiting: stop reading at once.
            _ = flowing.changed() => continue,
        };
        // Bytes read just before a cut are held until the heal.
        while !*flowing.borrow_and_update() {
            if flowing.changed().await.is_err() {
                return;
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

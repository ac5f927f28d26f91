//! A TCP relay that holds every chunk for a fixed one-way delay, as a
//! link between regions would, and that can be cut off and healed.
//!
//! Each direction is a reader stamping chunks with their due time and a
//! writer releasing them when due, joined by a channel, so bytes keep
//! flowing at full speed and only arrive late. Cut: every relayed
//! connection is dropped and new ones are closed on accept, so a sender
//! sees its connection fail and cannot reconnect. Heal: new connections
//! are relayed again.

use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

pub struct DelayRelay {
    pub addr: String,
    /// true while cut off; each change reaches every relayed connection.
    cut: watch::Sender<bool>,
    accept: tokio::task::JoinHandle<()>,
}

impl DelayRelay {
    pub async fn start(upstream: String, delay: Duration) -> DelayRelay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (cut, cut_rx) = watch::channel(false);
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if *cut_rx.borrow() {
                    drop(inbound);
                    continue;
                }
                let upstream = upstream.clone();
                let mut cut_rx = cut_rx.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let relay = relay_both(inbound, outbound, delay);
                    tokio::select! {
                        _ = relay => {}
                        _ = cut_rx.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        DelayRelay { addr, cut, accept }
    }

    /// Drops every connection and refuses new ones until [`heal`](Self::heal).
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    pub fn heal(&self) {
        self.cut.send_replace(false);
    }
}

impl Drop for DelayRelay {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut.send_replace(true);
    }
}

async fn relay_both(a: TcpStream, b: TcpStream, delay: Duration) {
    let (ar, aw) = a.into_split();
    let (br, bw) = b.into_split();
    tokio::join!(one_way(ar, bw, delay), one_way(br, aw, delay));
}

/// Moves bytes from `from` to `to`, each chunk `delay` after it was read.
async fn one_way(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = async move {
        let mut buf = vec![0u8; 32 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            if tx
                .send((Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
            {
                break;
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}

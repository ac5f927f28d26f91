//! The protocol port's listening socket, with the listen backlog of
//! `--backlog` (tokio's own `bind` asks for 128, which a burst of new
//! gateways overflows: the kernel then drops their SYNs and they wait
//! for a retransmission, a second or more).

use std::io;
use std::net::SocketAddr;
use tokio::net::{TcpListener, TcpSocket};

/// Binds `addr` (SO_REUSEADDR, as tokio does) and listens with room for
/// `backlog` connections not yet accepted (the kernel caps it at
/// `net.core.somaxconn`).
pub fn bind(addr: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn binds_and_accepts() {
        let listener = super::bind("127.0.0.1:0".parse().unwrap(), 4096).unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, accepted) =
            tokio::join!(tokio::net::TcpStream::connect(addr), listener.accept());
        assert_eq!(client.unwrap().local_addr().unwrap(), accepted.unwrap().1);
    }
}

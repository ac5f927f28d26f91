//! One socket type for plain TCP and TLS, so connections, handovers and the
//! replication stream do not care which the port speaks.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsStream;

/// A connection's byte stream: plain TCP, or TLS over TCP (either side).
#[derive(Debug)]
pub enum Socket {
    Plain(TcpStream),
    /// Boxed: a TLS session is a few kilobytes, a TCP stream a few words.
    Tls(Box<TlsStream<TcpStream>>),
}

impl Socket {
    /// The TCP stream underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Self::Plain(s) => s,
            Self::Tls(s) => s.get_ref().0,
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Self::Tls(_))
    }

    /// Bytes the kernel has received on the connection and not handed to
    /// a read yet (`FIONREAD`; under TLS, records not yet taken off the
    /// socket, without those rustls already holds). 0 when the kernel
    /// cannot say, and off Linux, where it is not asked.
    #[cfg(target_os = "linux")]
    pub fn unread(&self) -> usize {
        rustix::io::ioctl_fionread(self.tcp())
            .map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX))
    }

    /// See the Linux version: not asked here.
    #[cfg(not(target_os = "linux"))]
    pub fn unread(&self) -> usize {
        0
    }
}

impl From<tokio_rustls::server::TlsStream<TcpStream>> for Socket {
    fn from(s: tokio_rustls::server::TlsStream<TcpStream>) -> Self {
        Self::Tls(Box::new(TlsStream::Server(s)))
    }
}

impl From<tokio_rustls::client::TlsStream<TcpStream>> for Socket {
    fn from(s: tokio_rustls::client::TlsStream<TcpStream>) -> Self {
        Self::Tls(Box::new(TlsStream::Client(s)))
    }
}

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(s) => s.is_write_vectored(),
            Self::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

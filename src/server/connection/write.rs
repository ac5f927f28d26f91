//! Writing a connection's answers out: within the write timeout, flushed
//! out of any TLS buffer, stopped when the server aborts; on plain TCP one
//! `try_write` first, which is all most batches of answers need.

use crate::server::stop::Stop;
use crate::server::Shared;
use crate::tls::Socket;
use std::future::Future;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// Why answers could not be written out.
#[derive(Debug, thiserror::Error)]
pub(in crate::server) enum WriteError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("client did not read its answers within {0:?}")]
    Timeout(Duration),
}

/// Writes `bytes` out within the write timeout, flushed: TLS may keep the
/// tail of a write in its buffer when the socket is full (a no-op on plain
/// TCP). Ok(false) when the server aborted first (`abort`: the server's
/// stop, tested by its flag; `aborted`: a wait for it, made only when the
/// write must wait: on a connection's own child token where it has one, so
/// that waiting takes no lock every connection shares; nothing more is
/// sent); the protocol port and the RESP front end share it.
pub(in crate::server) async fn write_out<W: Future<Output = ()>>(
    stream: &mut Socket,
    bytes: &[u8],
    shared: &Shared,
    (abort, aborted): (&Stop, impl FnOnce() -> W),
) -> Result<bool, WriteError> {
    if bytes.is_empty() {
        return Ok(true);
    }
    let mut bytes = bytes;
    // Most answers fit in the socket's send buffer at once: one write, with
    // no timer and no waiter on `abort`. What does not fit takes the path
    // below.
    if let Socket::Plain(tcp) = stream {
        if abort.is_cancelled() {
            return Ok(false);
        }
        match tcp.try_write(bytes) {
            Ok(n) if n == bytes.len() => return Ok(true),
            Ok(n) => bytes = &bytes[n..],
            // Not writable now (or interrupted): the path below waits.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(WriteError::Io(e)),
        }
    }
    let t = shared.network.write_timeout;
    tokio::select! {
        biased;
        _ = aborted() => Ok(false),
        r = tokio::time::timeout(t, async {
            stream.write_all(bytes).await?;
            stream.flush().await
        }) => match r {
            Ok(r) => r.map(|()| true).map_err(WriteError::Io),
            Err(_) => Err(WriteError::Timeout(t)),
        },
    }
}

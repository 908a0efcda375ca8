//! An HTTP/2 client that never opens a stream yet answers everything the server asks of it (its
//! SETTINGS and PINGs), as a real client library does by itself: the connection a server that
//! counts bytes as activity would keep for ever.

use std::{
    io,
    sync::atomic::{AtomicUsize, Ordering},
};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The first bytes of every HTTP/2 connection, then an empty SETTINGS frame.
const OPENING: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const ACK: u8 = 0x1;
/// The largest frame a server sends before the client allows more (RFC 9113, 4.2).
const MAX_FRAME: usize = 16_384;

/// Speaks HTTP/2 on `stream` without a request, answering the server's SETTINGS and PINGs (each
/// PING answered is counted in `pings`), until the server closes the connection: `Ok` on its
/// orderly close, the error otherwise (a reset, a frame larger than allowed).
pub async fn answer_pings<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    pings: &AtomicUsize,
) -> io::Result<()> {
    stream.write_all(OPENING).await?;
    let mut header = [0u8; 9];
    let mut payload = vec![0u8; MAX_FRAME];
    // Bounded by the server: one turn per frame it sends, until it closes the connection.
    loop {
        match stream.read_exact(&mut header).await {
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(error) => return Err(error),
        }
        let length =
            usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        let (kind, flags) = (header[3], header[4]);
        let payload = payload.get_mut(..length).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a frame of {length} bytes"),
            )
        })?;
        stream.read_exact(payload).await?;
        if flags & ACK != 0 {
            continue;
        }
        match kind {
            SETTINGS => {
                stream
                    .write_all(&[0, 0, 0, SETTINGS, ACK, 0, 0, 0, 0])
                    .await?
            }
            PING => {
                let mut answer = vec![0, 0, 8, PING, ACK, 0, 0, 0, 0];
                answer.extend_from_slice(payload);
                stream.write_all(&answer).await?;
                pings.fetch_add(1, Ordering::SeqCst);
            }
            _ => {}
        }
    }
}

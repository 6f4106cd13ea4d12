//! Handing page file descriptors to other processes over an abstract Unix
//! socket (`SCM_RIGHTS`).
//!
//! PyTorch's expandable segments hand theirs over with `pidfd_getfd`, which
//! needs the right to trace the sending process: in containers and under Yama
//! (`ptrace_scope` 1) a child may not trace its parent, and the receiver fails
//! with "pidfd_getfd: Operation not permitted" (PyTorch issues #130330,
//! #165685). A socket needs no such right. The sending process serves one
//! socket, named `cachalot-ipc.<pid>.<random>` in the abstract namespace; a
//! handle names the socket and a random 16-byte token per share. Only processes
//! of the same user are served.
//!
//! Protocol: the receiver writes the token; the server answers with messages
//! of one status byte (0: ok) carrying at most [`FDS_PER_MESSAGE`]
//! descriptors, until all are sent; a non-zero status ends the answer.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::socket::{
    getsockopt, recvmsg, sendmsg, sockopt, ControlMessage, ControlMessageOwned, MsgFlags,
};

use cachalot_core::backend::BackendResult;
use cachalot_core::error::{Error, Result};

/// The most descriptors one message carries (the kernel allows 253).
pub const FDS_PER_MESSAGE: usize = 250;
/// Offers kept at most; the oldest goes first beyond it.
const OFFERS: usize = 1 << 16;
/// How long either side waits for the other.
const PATIENCE: Duration = Duration::from_secs(10);

const OK: u8 = 0;
const UNKNOWN: u8 = 1;
const EXPORT_FAILED: u8 = 2;

/// What makes the descriptors of one offer, each time a receiver asks.
pub type Producer = Arc<dyn Fn() -> BackendResult<Vec<OwnedFd>> + Send + Sync>;

#[derive(Default)]
struct Offers {
    by_token: HashMap<[u8; 16], Producer>,
    order: VecDeque<[u8; 16]>,
}

/// The serving socket of this process.
pub struct FdServer {
    name: String,
    offers: Arc<Mutex<Offers>>,
}

impl std::fmt::Debug for FdServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FdServer")
            .field("name", &self.name)
            .finish()
    }
}

fn lock(offers: &Mutex<Offers>) -> MutexGuard<'_, Offers> {
    offers.lock().unwrap_or_else(|e| e.into_inner())
}

fn random_bytes() -> [u8; 16] {
    let mut out = [0u8; 16];
    let (lo, hi) = out.split_at_mut(8);
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    lo.copy_from_slice(&RandomState::new().hash_one(at).to_le_bytes());
    hi.copy_from_slice(
        &RandomState::new()
            .hash_one(std::process::id())
            .to_le_bytes(),
    );
    out
}

fn ipc_error(what: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("sharing memory between processes: {what}"))
}

impl FdServer {
    /// Binds a fresh socket and serves it from a background thread.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the socket or the thread cannot be made.
    pub fn start() -> Result<FdServer> {
        let suffix: String = random_bytes()[..6]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let name = format!("cachalot-ipc.{}.{suffix}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).map_err(ipc_error)?;
        let listener = UnixListener::bind_addr(&addr).map_err(ipc_error)?;
        let offers = Arc::new(Mutex::new(Offers::default()));
        let served = offers.clone();
        std::thread::Builder::new()
            .name("cachalot-ipc".into())
            .spawn(move || serve(&listener, &served))
            .map_err(ipc_error)?;
        Ok(FdServer { name, offers })
    }

    /// The socket's name in the abstract namespace.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Offers descriptors made by `producer` under a new token.
    pub fn offer(&self, producer: Producer) -> [u8; 16] {
        let token = random_bytes();
        let mut o = lock(&self.offers);
        o.by_token.insert(token, producer);
        o.order.push_back(token);
        while o.order.len() > OFFERS {
            if let Some(old) = o.order.pop_front() {
                o.by_token.remove(&old);
            }
        }
        token
    }
}

fn serve(listener: &UnixListener, offers: &Mutex<Offers>) {
    // A failed accept or answer only fails that receiver, which reports it.
    for stream in listener.incoming().flatten() {
        let _ = answer(stream, offers);
    }
}

fn same_user(stream: &UnixStream) -> bool {
    getsockopt(stream, sockopt::PeerCredentials)
        .is_ok_and(|c| c.uid() == nix::unistd::getuid().as_raw())
}

fn answer(mut stream: UnixStream, offers: &Mutex<Offers>) -> std::io::Result<()> {
    stream.set_read_timeout(Some(PATIENCE))?;
    stream.set_write_timeout(Some(PATIENCE))?;
    let mut token = [0u8; 16];
    stream.read_exact(&mut token)?;
    let producer = same_user(&stream)
        .then(|| lock(offers).by_token.get(&token).cloned())
        .flatten();
    let Some(producer) = producer else {
        return stream.write_all(&[UNKNOWN]);
    };
    let Ok(fds) = producer() else {
        return stream.write_all(&[EXPORT_FAILED]);
    };
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    for chunk in raw.chunks(FDS_PER_MESSAGE) {
        let rights = [ControlMessage::ScmRights(chunk)];
        sendmsg::<()>(
            stream.as_raw_fd(),
            &[IoSlice::new(&[OK])],
            &rights,
            MsgFlags::empty(),
            None,
        )?;
    }
    Ok(())
}

/// Asks the server `socket` for the `count` descriptors offered under `token`.
///
/// # Errors
/// [`Error::InvalidArgument`] when the server is gone (the sending process
/// ended), does not know the token (too old, or another user's), could not
/// export its pages, or sends fewer descriptors.
pub fn fetch(socket: &str, token: &[u8; 16], count: usize) -> Result<Vec<OwnedFd>> {
    let addr = SocketAddr::from_abstract_name(socket.as_bytes()).map_err(ipc_error)?;
    let mut stream = UnixStream::connect_addr(&addr).map_err(|e| {
        ipc_error(format!(
            "cannot reach the sending process at {socket} ({e}); it must still be running"
        ))
    })?;
    stream.set_read_timeout(Some(PATIENCE)).map_err(ipc_error)?;
    stream.write_all(token).map_err(ipc_error)?;
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        let (status, fds) = receive(&stream)?;
        match status {
            Some(OK) if !fds.is_empty() => out.extend(fds),
            Some(UNKNOWN) => {
                return Err(ipc_error(
                    "the sending process does not know this handle (too old, or another user's)",
                ))
            }
            Some(EXPORT_FAILED) => {
                return Err(ipc_error(
                    "the sending process could not export the pages (freed already?)",
                ))
            }
            _ => {
                return Err(ipc_error(format!(
                    "the sending process sent {} of {count} page descriptors",
                    out.len()
                )))
            }
        }
    }
    Ok(out)
}

/// One message: its status byte (none at the end of the stream) and the
/// descriptors it carried, owned.
fn receive(stream: &UnixStream) -> Result<(Option<u8>, Vec<OwnedFd>)> {
    let mut status = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut status)];
    let mut space = nix::cmsg_space!([RawFd; FDS_PER_MESSAGE]);
    let msg = recvmsg::<()>(
        stream.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(ipc_error)?;
    let mut fds = Vec::new();
    for c in msg.cmsgs().map_err(ipc_error)? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            // SAFETY: the kernel installed each received descriptor in this
            // process for us; nothing else holds them.
            fds.extend(
                raw.into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    let got = (msg.bytes == 1).then_some(status[0]);
    Ok((got, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Seek;

    fn file_with(byte: u8) -> OwnedFd {
        let mut f = tempfile_in_tmp();
        f.write_all(&[byte]).unwrap();
        f.rewind().unwrap();
        f.into()
    }

    fn tempfile_in_tmp() -> std::fs::File {
        let path = std::env::temp_dir().join(format!(
            "cachalot-ipc-test-{:x}",
            RandomState::new().hash_one(1)
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }

    fn byte_of(fd: OwnedFd) -> u8 {
        let mut f = std::fs::File::from(fd);
        let mut b = [0u8; 1];
        f.read_exact(&mut b).unwrap();
        b[0]
    }

    #[test]
    fn descriptors_travel_in_order_past_one_message() {
        let server = FdServer::start().unwrap();
        let n = FDS_PER_MESSAGE + 3;
        let token = server.offer(Arc::new(move || {
            Ok((0..n).map(|i| file_with((i % 251) as u8)).collect())
        }));
        let fds = fetch(server.name(), &token, n).unwrap();
        assert_eq!(fds.len(), n);
        let bytes: Vec<u8> = fds.into_iter().map(byte_of).collect();
        assert!(bytes.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
    }

    #[test]
    fn unknown_tokens_failed_exports_and_dead_servers_are_errors() {
        let server = FdServer::start().unwrap();
        let e = fetch(server.name(), &[0; 16], 1).unwrap_err().to_string();
        assert!(e.contains("does not know"), "{e}");
        let failing = server.offer(Arc::new(|| {
            Err(cachalot_core::backend::BackendError::Unavailable(
                "gone".into(),
            ))
        }));
        let e = fetch(server.name(), &failing, 1).unwrap_err().to_string();
        assert!(e.contains("could not export"), "{e}");
        let short = server.offer(Arc::new(|| Ok(vec![file_with(1)])));
        let e = fetch(server.name(), &short, 2).unwrap_err().to_string();
        assert!(e.contains("1 of 2"), "{e}");
        let e = fetch("cachalot-ipc.no-such-process", &[0; 16], 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("still be running"), "{e}");
    }
}

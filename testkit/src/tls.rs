//! TLS for the tests' own servers: an acceptor from a PEM certificate and
//! key (made by [`crate::certs`]), used by the test registry, and
//! [`TlsFront`], a TLS-terminating front for a plain server (moto's S3),
//! as a load balancer stands before MinIO or a registry in production.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_rustls::rustls;
use tokio_rustls::TlsAcceptor;

/// A TLS acceptor for the PEM certificate chain `cert` and PKCS#8 key
/// `key` (ring's provider: the build has two, so none is the default).
pub(crate) fn acceptor(cert: &std::path::Path, key: &std::path::Path) -> io::Result<TlsAcceptor> {
    let bad = |e: String| io::Error::new(io::ErrorKind::InvalidInput, e);
    let chain: Vec<rustls::pki_types::CertificateDer<'static>> = pem_blocks(cert, "CERTIFICATE")?
        .into_iter()
        .map(rustls::pki_types::CertificateDer::from)
        .collect();
    let key_der = pem_blocks(key, "PRIVATE KEY")?
        .into_iter()
        .next()
        .ok_or_else(|| bad(format!("{}: no PKCS#8 PRIVATE KEY", key.display())))?;
    let key_der = rustls::pki_types::PrivateKeyDer::Pkcs8(key_der.into());
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| bad(e.to_string()))?
    .with_no_client_auth()
    .with_single_cert(chain, key_der)
    .map_err(|e| bad(format!("{}: {e}", cert.display())))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The DER bytes of each `-----BEGIN {label}-----` block of a PEM file.
fn pem_blocks(path: &std::path::Path, label: &str) -> io::Result<Vec<Vec<u8>>> {
    use base64::Engine as _;
    let text = std::fs::read_to_string(path)?;
    let (begin, end) = (
        format!("-----BEGIN {label}-----"),
        format!("-----END {label}-----"),
    );
    let mut out = Vec::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find(&begin) {
        let body = &rest[at + begin.len()..];
        let stop = body.find(&end).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: unterminated {label}", path.display()),
            )
        })?;
        let b64: String = body[..stop].split_whitespace().collect();
        out.push(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?,
        );
        rest = &body[stop + end.len()..];
    }
    Ok(out)
}

/// A server on a thread of its own (a current-thread runtime): each
/// connection `listener` accepts goes to `conn` on a task of its own.
/// Dropping it (or [`Served::stop`]) stops accepting and closes what is open.
pub(crate) struct Served {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

pub(crate) fn serve_on_thread<F, Fut>(
    name: &str,
    listener: std::net::TcpListener,
    conn: F,
) -> io::Result<Served>
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    listener.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    let (stop, mut stopped) = oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            runtime.block_on(async move {
                let Ok(listener) = TcpListener::from_std(listener) else {
                    return;
                };
                loop {
                    tokio::select! {
                        _ = &mut stopped => return,
                        accepted = listener.accept() => {
                            let Ok((stream, _)) = accepted else { continue };
                            tokio::spawn(conn(stream));
                        }
                    }
                }
            });
            // Dropping the runtime closes the open connections.
        })?;
    Ok(Served {
        stop: Some(stop),
        thread: Some(thread),
    })
}

impl Served {
    /// Stops accepting, closes the open connections, joins the thread.
    pub(crate) fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A TLS front on a free loopback port for the plain server at
/// `upstream`: every connection's TLS ends here and its bytes go on to the
/// server as they are. Dropping it stops accepting and closes what is open.
pub struct TlsFront {
    addr: SocketAddr,
    _served: Served,
}

impl TlsFront {
    /// Serves `cert` (PEM chain) and `key` (PKCS#8 PEM) before `upstream`.
    pub fn start(upstream: SocketAddr, cert: &Path, key: &Path) -> io::Result<TlsFront> {
        let tls = acceptor(cert, key)?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let served = serve_on_thread("tls-front", listener, move |stream| {
            let tls = tls.clone();
            async move {
                // A client that does not trust the certificate ends at
                // the handshake.
                let Ok(mut front) = tls.accept(stream).await else {
                    return;
                };
                let Ok(mut back) = TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut front, &mut back).await;
            }
        })?;
        Ok(TlsFront {
            addr,
            _served: served,
        })
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }
}

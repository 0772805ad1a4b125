//! The operator's HTTP endpoint (`[http] listen`, `run --http`): `/metrics`
//! (OpenMetrics text when asked for, as Prometheus does; the Prometheus text
//! format otherwise), `/health` (liveness) and `/ready` (readiness), read
//! from one `Metrics`. HTTP/1 only, three routes, no state of its own.

use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, PublicResult};
use crate::metrics::{Format, Metrics};

/// Binds `addr` (port 0: any free port) and serves the probes until
/// `shutdown`. Returns the bound address and the server's task.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> PublicResult<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| Error::config(format!("http.listen: cannot listen on {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::config(format!("http.listen: the bound address: {e}")))?;
    tracing::info!(listen = %bound, "serving /metrics, /health and /ready");
    let task = tokio::spawn(accept(listener, metrics, shutdown));
    Ok((bound, task))
}

async fn accept(listener: TcpListener, metrics: Arc<Metrics>, shutdown: CancellationToken) {
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "http: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let m = metrics.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let m = m.clone();
                async move { Ok::<_, std::convert::Infallible>(respond(&m, &req)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = stop.cancelled() => {}
                done = conn => if let Err(e) = done {
                    tracing::debug!(error = %e, "http: connection ended");
                },
            }
        });
    }
}

fn respond(metrics: &Metrics, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        );
    }
    match req.uri().path() {
        "/metrics" => {
            let accept = req.headers().get(hyper::header::ACCEPT);
            let format = Format::accepted(accept.and_then(|v| v.to_str().ok()));
            reply(
                StatusCode::OK,
                format.content_type(),
                metrics.encode_as(format),
            )
        }
        "/ready" => {
            let r = metrics.readiness();
            json(r.ready, &r)
        }
        "/health" => {
            let h = metrics.health();
            json(h.healthy, &h)
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "try /metrics, /health or /ready\n".into(),
        ),
    }
}

fn json(ok: bool, body: &impl serde::Serialize) -> Response<Full<Bytes>> {
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let text = serde_json::to_string(body).unwrap_or_default() + "\n";
    reply(status, "application/json", text)
}

fn reply(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

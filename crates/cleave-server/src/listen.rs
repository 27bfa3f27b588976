//! Accepting connections so that slow or silent clients cannot hold the
//! server: a cap on open connections (the one past it gets a 503 and is
//! closed), and a deadline for each request's headers, which also closes a
//! keep-alive connection that sits idle. Bodies get their own deadline in
//! [`crate::routes::read_body`].

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};

/// How many connections may be open, and how long a request's headers may
/// take to arrive (counted from the end of the previous request on a
/// keep-alive connection).
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

/// Serves `router` on `listener` until `shutdown` completes, then stops
/// accepting, asks every connection to close once its running request is
/// answered, and returns when all have closed.
pub async fn serve_connections(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let (closing, closing_seen) = watch::channel(false);
    // Every connection task holds a sender: when all are gone, so are the
    // connections.
    let (open, mut all_closed) = mpsc::channel::<()>(1);
    let mut shutdown = pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait, don't spin.
                    eprintln!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tokio::spawn(refuse(stream, limits.max_connections));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let mut closing_seen = closing_seen.clone();
        let open = open.clone();
        tokio::spawn(async move {
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout);
            let mut connection = pin!(builder.serve_connection(TokioIo::new(stream), service));
            let mut told = false;
            loop {
                tokio::select! {
                    _ = connection.as_mut() => break,
                    _ = closing_seen.wait_for(|c| *c), if !told => {
                        told = true;
                        connection.as_mut().graceful_shutdown();
                    }
                }
            }
            drop(permit);
            drop(open);
        });
    }
    let _ = closing.send(true);
    drop(open);
    let _ = all_closed.recv().await;
}

/// Answers a connection past the cap with a 503 and closes it, giving the
/// client at most a second to take the answer.
async fn refuse(mut stream: TcpStream, cap: usize) {
    let body = format!(
        "{{\"error\":{{\"message\":\"the server has {cap} connections open, its limit: try again shortly\",\
         \"type\":\"server_error\",\"param\":null,\"code\":\"too_many_connections\"}}}}"
    );
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(response.as_bytes())).await;
}

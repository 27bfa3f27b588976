//! Accepting connections so that slow or silent clients cannot hold the
//! server: a cap on open connections (the one past it gets a 503 and is
//! closed), and a deadline for each request's headers, which also closes a
//! keep-alive connection that sits idle. Bodies get their own deadline in
//! [`crate::routes::read_body`].
//!
//! A connection ends with a lingering close (as nginx's): a client may
//! still be sending a body the server answered without reading (a 413),
//! and closing at once would reset the connection under it, so that it
//! sees a broken pipe instead of the answer. At shutdown, connections with
//! no request running close at once; the others once their answer is out.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, HttpBody};
use axum::extract::Request;
use axum::Router;
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::time::Instant;
use tower::ServiceExt;

/// How many connections may be open, and how long a request's headers may
/// take to arrive (counted from the end of the previous request on a
/// keep-alive connection).
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

/// A lingering close reads and drops what the client still sends for at
/// most this long in all, this long without a byte, and this many bytes.
const LINGER_TIME: Duration = Duration::from_secs(10);
const LINGER_IDLE: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 64 << 20;

/// Serves `router` on `listener` until `shutdown` completes, then stops
/// accepting, closes every connection that has no request running, lets
/// the others close once their answer is out, and returns when all have
/// closed.
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
        let router = router.clone();
        let closing_seen = closing_seen.clone();
        let open = open.clone();
        tokio::spawn(async move {
            serve_connection(stream, router, limits, closing_seen).await;
            drop(permit);
            drop(open);
        });
    }
    let _ = closing.send(true);
    drop(open);
    let _ = all_closed.recv().await;
}

/// Serves one connection until the client closes it, it times out, or the
/// server shuts down, then closes it.
async fn serve_connection(
    stream: TcpStream,
    router: Router,
    limits: ConnectionLimits,
    mut closing: watch::Receiver<bool>,
) {
    let running = Arc::new(AtomicUsize::new(0));
    let service = {
        let running = running.clone();
        service_fn(move |request: Request<Incoming>| {
            let until_answered = Running::start(running.clone());
            let router = router.clone();
            Box::pin(async move {
                let response = router.oneshot(request.map(Body::new)).await?;
                Ok::<_, std::convert::Infallible>(response.map(|body| {
                    Body::new(Answering {
                        body,
                        _running: until_answered,
                    })
                }))
            })
        })
    };
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let mut connection = builder.serve_connection(TokioIo::new(stream), service);
    let mut told = false;
    let served = loop {
        tokio::select! {
            served = poll_fn(|cx| connection.poll_without_shutdown(cx)) => break served,
            _ = closing.wait_for(|c| *c), if !told => {
                told = true;
                // Idle, or its request's headers still on the way: nothing
                // to wait for.
                if running.load(Ordering::Relaxed) == 0 {
                    return;
                }
                Pin::new(&mut connection).graceful_shutdown();
            }
        }
    };
    if served.is_ok() && !*closing.borrow() {
        linger(connection.into_parts().io.into_inner(), closing).await;
    }
}

/// Counts a request as running from its call until its answer's body is
/// done (or dropped): a streamed answer runs as long as its stream.
struct Running(Arc<AtomicUsize>);

impl Running {
    fn start(count: Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Running(count)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An answer's body, holding its request's [`Running`] until it is done.
struct Answering {
    body: Body,
    _running: Running,
}

impl HttpBody for Answering {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// Closes `stream` after its last answer: shuts the writing side (the
/// client reads the answer and the end), then reads and drops what the
/// client still sends, within the linger bounds or until shutdown.
async fn linger(mut stream: TcpStream, mut closing: watch::Receiver<bool>) {
    if stream.shutdown().await.is_err() {
        return;
    }
    let deadline = Instant::now() + LINGER_TIME;
    let mut buffer = vec![0; 16 << 10];
    let mut dropped = 0;
    while dropped < LINGER_BYTES {
        let wait = deadline.min(Instant::now() + LINGER_IDLE);
        tokio::select! {
            read = tokio::time::timeout_at(wait, stream.read(&mut buffer)) => match read {
                Ok(Ok(n)) if n > 0 => dropped += n,
                // The client closed, failed, or went quiet.
                _ => return,
            },
            _ = closing.wait_for(|c| *c) => return,
        }
    }
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

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::SocketAddr;

    use axum::http::StatusCode;
    use axum::routing::{get, post};

    use super::*;

    /// Serves `router` on a free port with a 30 s header deadline; the
    /// returned sender starts the shutdown, the handle ends with the server.
    async fn start(
        router: Router,
    ) -> (
        SocketAddr,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let limits = ConnectionLimits {
            max_connections: 8,
            header_timeout: Duration::from_secs(30),
        };
        let server = tokio::spawn(serve_connections(listener, router, limits, async move {
            let _ = stopped.await;
        }));
        (address, stop, server)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_that_sends_its_whole_body_reads_the_answer_given_before_it() {
        // Answers without reading the body, as a Content-Length past
        // --max-body is answered.
        let router = Router::new().route("/", post(|| async { StatusCode::PAYLOAD_TOO_LARGE }));
        let (address, stop, server) = start(router).await;
        let answer = tokio::task::spawn_blocking(move || {
            // As Python's urllib sends a request: headers, then the whole
            // body, and only then a read.
            let body = vec![b'x'; 5 << 20];
            let mut client = std::net::TcpStream::connect(address).unwrap();
            let head = format!("POST / HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n", body.len());
            client.write_all(head.as_bytes()).unwrap();
            client.write_all(&body).map_err(|e| format!("sending the body: {e}"))?;
            let mut answer = String::new();
            client
                .read_to_string(&mut answer)
                .map_err(|e| format!("reading: {e}"))?;
            Ok::<_, String>(answer)
        })
        .await
        .unwrap();
        let answer = answer.unwrap();
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
        let _ = stop.send(());
        server.await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_closes_idle_connections_at_once_and_finishes_running_requests() {
        let router = Router::new().route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                "done"
            }),
        );
        let (address, stop, server) = start(router).await;
        let mut idle = TcpStream::connect(address).await.unwrap();
        let mut half_sent = TcpStream::connect(address).await.unwrap();
        half_sent.write_all(b"GET /slow HTTP/1.1\r\nhost: x\r\n").await.unwrap();
        let mut running = TcpStream::connect(address).await.unwrap();
        running
            .write_all(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let started = Instant::now();
        let _ = stop.send(());
        let mut answer = String::new();
        running.read_to_string(&mut answer).await.unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("done"),
            "{answer}"
        );
        tokio::time::timeout(Duration::from_secs(2), server)
            .await
            .expect("the server waited for idle connections")
            .unwrap();
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        for closed in [&mut idle, &mut half_sent] {
            let mut rest = Vec::new();
            let read = closed.read_to_end(&mut rest).await;
            assert!(read.is_err() || rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
        }
    }
}

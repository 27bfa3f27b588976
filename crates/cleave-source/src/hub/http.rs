//! The hub's HTTP, with nothing a server sends taken on trust: every wait
//! is bounded (connect, each read, a whole small answer), redirects are
//! followed by hand (at most `MAX_REDIRECTS`, relative ones resolved, none
//! from https down to http), and the token goes only to the hub's own
//! origin, never to a CDN or elsewhere a redirect names. Statuses are the
//! caller's to judge.

use std::time::Duration;

use ureq::http::{Response, StatusCode};
use ureq::Body;
use url::Url;

/// huggingface_hub follows a handful; a longer chain is a loop.
const MAX_REDIRECTS: usize = 10;

/// Why a request got no answer to judge.
#[derive(Debug)]
pub enum Fault {
    /// No connection, no byte in time, a connection dropped: the network.
    Transport(String),
    /// An answer that cannot be followed: a redirect loop, a redirect
    /// without a place to go, or to somewhere that is no web address.
    Redirect(String),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Transport(reason) | Fault::Redirect(reason) => f.write_str(reason),
        }
    }
}

pub struct Client {
    agent: ureq::Agent,
    /// The hub's origin: the only one that is sent the token.
    origin: url::Origin,
    token: Option<String>,
}

impl Client {
    pub fn new(endpoint: &Url, token: Option<String>, wait: Duration) -> Self {
        let agent = ureq::Agent::config_builder()
            .max_redirects(0)
            .http_status_as_error(false)
            .timeout_resolve(Some(wait))
            .timeout_connect(Some(wait))
            .timeout_per_read(Some(wait))
            .timeout_per_write(Some(wait))
            .user_agent(concat!("cleave/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Client {
            agent,
            origin: endpoint.origin(),
            token,
        }
    }

    /// GETs `url` from byte `from` on (a range request where `from` is
    /// set), following redirects; the last answer, whatever its status.
    /// `whole` bounds each answer's headers and body together, for an
    /// answer read all at once (a file's reader bounds its own rate).
    pub fn get(&self, mut url: Url, from: Option<u64>, whole: Option<Duration>) -> Result<Response<Body>, Fault> {
        for _ in 0..=MAX_REDIRECTS {
            let mut request = self.agent.get(url.as_str()).config().timeout_global(whole).build();
            if let (Some(token), true) = (&self.token, url.origin() == self.origin) {
                request = request.header("authorization", format!("Bearer {token}"));
            }
            if let Some(from) = from {
                request = request.header("range", format!("bytes={from}-"));
            }
            let response = request.call().map_err(|e| Fault::Transport(describe(&e, &url)))?;
            if !is_redirect(response.status()) {
                return Ok(response);
            }
            url = next_hop(&url, &response)?;
        }
        Err(Fault::Redirect(format!(
            "more than {MAX_REDIRECTS} redirects from {url}: a redirect loop"
        )))
    }
}

fn is_redirect(status: StatusCode) -> bool {
    matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308)
}

/// Where a redirect sends a request: its `Location`, relative to `from`.
fn next_hop(from: &Url, response: &Response<Body>) -> Result<Url, Fault> {
    let status = response.status().as_u16();
    let location = response
        .headers()
        .get("location")
        .and_then(|l| l.to_str().ok())
        .ok_or_else(|| Fault::Redirect(format!("{from} answered {status} (a redirect) with no Location")))?;
    let to = from
        .join(location)
        .map_err(|e| Fault::Redirect(format!("{from} redirects to '{location}', which is no address: {e}")))?;
    match (from.scheme(), to.scheme()) {
        (_, "https") | ("http", "http") => Ok(to),
        (from_scheme, to_scheme) => Err(Fault::Redirect(format!(
            "{from} redirects to {to}: from {from_scheme} to {to_scheme} is not followed"
        ))),
    }
}

/// A ureq error as a sentence naming the address.
pub fn describe(error: &ureq::Error, url: &Url) -> String {
    match error {
        ureq::Error::Timeout(_) => format!("no answer from {url} in time"),
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => {
            format!("no answer from {url} in time")
        }
        other => format!("{url}: {other}"),
    }
}

/// Whether a read of a body failed for lack of a byte in time.
pub fn is_timeout(error: &std::io::Error) -> bool {
    if error.kind() == std::io::ErrorKind::TimedOut {
        return true;
    }
    error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<ureq::Error>())
        .is_some_and(|e| match e {
            ureq::Error::Timeout(_) => true,
            ureq::Error::Io(io) => io.kind() == std::io::ErrorKind::TimedOut,
            _ => false,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redirect(location: Option<&str>) -> Response<Body> {
        let mut builder = Response::builder().status(302);
        if let Some(location) = location {
            builder = builder.header("location", location);
        }
        builder.body(Body::builder().data("")).unwrap()
    }

    #[test]
    fn a_relative_redirect_is_resolved_against_the_address_it_came_from() {
        let from = Url::parse("http://127.0.0.1:9/org/m/resolve/c/a.json").unwrap();
        assert_eq!(
            next_hop(&from, &redirect(Some("../x/b.json"))).unwrap().as_str(),
            "http://127.0.0.1:9/org/m/resolve/x/b.json"
        );
        assert_eq!(
            next_hop(&from, &redirect(Some("https://cdn.example/f")))
                .unwrap()
                .as_str(),
            "https://cdn.example/f"
        );
    }

    #[test]
    fn a_redirect_without_location_or_down_to_http_or_to_no_web_address_is_refused() {
        let from = Url::parse("https://hub.example/a").unwrap();
        for (location, says) in [
            (None, "with no Location"),
            (Some("http://hub.example/a"), "from https to http"),
            (Some("file:///etc/passwd"), "from https to file"),
        ] {
            let err = next_hop(&from, &redirect(location)).unwrap_err().to_string();
            assert!(err.contains(says), "{location:?}: {err}");
        }
    }
}

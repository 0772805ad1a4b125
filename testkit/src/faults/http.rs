//! Just enough HTTP/1.1 framing for the fault proxy: one message head and
//! its body at a time, keeping the raw bytes, so what the proxy forwards or
//! relays is byte for byte what it read (SigV4 signs some headers; moving
//! or re-encoding them would make a test about faults fail for another reason).

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt};

/// A head this long is garbage, not S3.
const MAX_HEAD: usize = 64 * 1024;
/// S3 requests and replies carry a dozen or two headers.
const MAX_HEADERS: usize = 96;
/// A chunk-size line or trailer line.
const MAX_LINE: usize = 8 * 1024;

/// Header names lowercased, values as text (non-UTF-8 values are kept
/// lossily; they are only inspected, the raw head is what is sent on).
#[derive(Debug, Default)]
pub(crate) struct Headers(Vec<(String, String)>);

impl Headers {
    fn from_parsed(parsed: &[httparse::Header<'_>]) -> Headers {
        Headers(
            parsed
                .iter()
                .map(|h| {
                    let value = String::from_utf8_lossy(h.value).trim().to_string();
                    (h.name.to_ascii_lowercase(), value)
                })
                .collect(),
        )
    }

    fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether a comma-separated header (`Connection`, `Expect`, ...) lists `token`.
    pub(crate) fn has_token(&self, name: &str, token: &str) -> bool {
        self.all(name)
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    }

    fn content_length(&self) -> io::Result<Option<u64>> {
        let mut found = None;
        for v in self.all("content-length") {
            let n: u64 = v
                .parse()
                .map_err(|_| invalid(format!("bad content-length {v:?}")))?;
            // Repeated but equal values are allowed (RFC 9112 6.3); different ones are not.
            if found.is_some_and(|f| f != n) {
                return Err(invalid("conflicting content-length headers".into()));
            }
            found = Some(n);
        }
        Ok(found)
    }

    fn chunked(&self) -> bool {
        // Only the last transfer coding decides the framing.
        self.all("transfer-encoding")
            .flat_map(|v| v.split(','))
            .last()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("chunked"))
    }

    /// Whether the connection ends after this message: `Connection: close`,
    /// or HTTP/1.0 without `Connection: keep-alive`.
    pub(crate) fn closes(&self, minor_version: u8) -> bool {
        self.has_token("connection", "close")
            || (minor_version == 0 && !self.has_token("connection", "keep-alive"))
    }
}

/// How a message body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framing {
    None,
    Length(u64),
    Chunked,
    /// A response without length: the body is everything up to EOF.
    UntilClose,
}

#[derive(Debug)]
pub(crate) struct RequestHead {
    pub raw: Vec<u8>,
    pub method: String,
    /// The request target as sent (path and query).
    pub target: String,
    pub minor_version: u8,
    pub headers: Headers,
}

impl RequestHead {
    pub(crate) fn framing(&self) -> io::Result<Framing> {
        if self.headers.chunked() {
            return Ok(Framing::Chunked);
        }
        Ok(match self.headers.content_length()? {
            Some(0) | None => Framing::None,
            Some(n) => Framing::Length(n),
        })
    }

    pub(crate) fn expects_continue(&self) -> bool {
        self.headers.has_token("expect", "100-continue")
    }
}

#[derive(Debug)]
pub(crate) struct ResponseHead {
    pub raw: Vec<u8>,
    pub status: u16,
    pub minor_version: u8,
    pub headers: Headers,
}

impl ResponseHead {
    /// RFC 9112 6.3: HEAD replies, 1xx, 204 and 304 have no body whatever
    /// their headers say.
    pub(crate) fn framing(&self, request_method: &str) -> io::Result<Framing> {
        if request_method.eq_ignore_ascii_case("HEAD")
            || (100..200).contains(&self.status)
            || self.status == 204
            || self.status == 304
        {
            return Ok(Framing::None);
        }
        if self.headers.chunked() {
            return Ok(Framing::Chunked);
        }
        Ok(match self.headers.content_length()? {
            Some(n) => Framing::Length(n),
            None => Framing::UntilClose,
        })
    }
}

/// A byte stream with a buffer of what was read but not yet consumed, so a
/// pipelined or kept-alive next message is not lost.
pub(crate) struct Reader<S> {
    stream: S,
    buf: Vec<u8>,
}

impl<S: AsyncRead + Unpin> Reader<S> {
    pub(crate) fn new(stream: S) -> Reader<S> {
        Reader {
            stream,
            buf: Vec::with_capacity(8 * 1024),
        }
    }

    pub(crate) fn get_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    pub(crate) fn get_ref(&self) -> &S {
        &self.stream
    }

    /// Reads more into the buffer; false at EOF.
    async fn fill(&mut self) -> io::Result<bool> {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk).await?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n > 0)
    }

    /// The next request head, or `None` if the peer closed the connection
    /// between requests (the normal end of a kept-alive connection).
    pub(crate) async fn request_head(&mut self) -> io::Result<Option<RequestHead>> {
        loop {
            let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut req = httparse::Request::new(&mut slots);
            if let httparse::Status::Complete(n) = req.parse(&self.buf).map_err(parse_error)? {
                let head = RequestHead {
                    raw: self.buf[..n].to_vec(),
                    method: req.method.unwrap_or_default().to_string(),
                    target: req.path.unwrap_or_default().to_string(),
                    minor_version: req.version.unwrap_or(1),
                    headers: Headers::from_parsed(req.headers),
                };
                self.buf.drain(..n);
                return Ok(Some(head));
            }
            self.more_head().await?;
            if self.buf.is_empty() {
                return Ok(None);
            }
        }
    }

    pub(crate) async fn response_head(&mut self) -> io::Result<ResponseHead> {
        loop {
            let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut resp = httparse::Response::new(&mut slots);
            if let httparse::Status::Complete(n) = resp.parse(&self.buf).map_err(parse_error)? {
                let head = ResponseHead {
                    raw: self.buf[..n].to_vec(),
                    status: resp.code.unwrap_or_default(),
                    minor_version: resp.version.unwrap_or(1),
                    headers: Headers::from_parsed(resp.headers),
                };
                self.buf.drain(..n);
                return Ok(head);
            }
            self.more_head().await?;
            if self.buf.is_empty() {
                return Err(eof("connection closed before a response"));
            }
        }
    }

    /// One more read while a head is incomplete. An empty buffer after it
    /// means a clean EOF; a partial head at EOF is an error.
    async fn more_head(&mut self) -> io::Result<()> {
        if self.buf.len() > MAX_HEAD {
            return Err(invalid(format!("message head over {MAX_HEAD} bytes")));
        }
        if !self.fill().await? && !self.buf.is_empty() {
            return Err(eof("connection closed inside a message head"));
        }
        Ok(())
    }

    /// The body as it was on the wire (chunk framing and trailers included).
    pub(crate) async fn body(&mut self, framing: Framing) -> io::Result<Vec<u8>> {
        match framing {
            Framing::None => Ok(Vec::new()),
            Framing::Length(n) => {
                let n = usize::try_from(n).map_err(|_| invalid("body too large".into()))?;
                self.take(n).await
            }
            Framing::Chunked => self.chunked_body().await,
            Framing::UntilClose => {
                while self.fill().await? {}
                Ok(std::mem::take(&mut self.buf))
            }
        }
    }

    async fn chunked_body(&mut self) -> io::Result<Vec<u8>> {
        let mut raw = Vec::new();
        loop {
            let line = self.line().await?;
            let size = chunk_size(&line)?;
            raw.extend_from_slice(&line);
            if size == 0 {
                // Trailer fields, then the empty line that ends the body.
                loop {
                    let line = self.line().await?;
                    raw.extend_from_slice(&line);
                    if line == b"\r\n" || line == b"\n" {
                        return Ok(raw);
                    }
                }
            }
            let data = self.take(size + 2).await?;
            if !data.ends_with(b"\r\n") {
                return Err(invalid("chunk not followed by CRLF".into()));
            }
            raw.extend_from_slice(&data);
        }
    }

    /// Exactly `n` bytes.
    async fn take(&mut self, n: usize) -> io::Result<Vec<u8>> {
        while self.buf.len() < n {
            if !self.fill().await? {
                return Err(eof("connection closed inside a body"));
            }
        }
        Ok(self.buf.drain(..n).collect())
    }

    /// One line including its line end.
    async fn line(&mut self) -> io::Result<Vec<u8>> {
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                return Ok(self.buf.drain(..=i).collect());
            }
            if self.buf.len() > MAX_LINE {
                return Err(invalid("chunk line too long".into()));
            }
            if !self.fill().await? {
                return Err(eof("connection closed inside a chunked body"));
            }
        }
    }
}

/// `1a2b;ext=x\r\n` → 0x1a2b.
fn chunk_size(line: &[u8]) -> io::Result<usize> {
    let text = std::str::from_utf8(line).map_err(|_| invalid("chunk size not text".into()))?;
    let hex = text.split(';').next().unwrap_or_default().trim();
    usize::from_str_radix(hex, 16).map_err(|_| invalid(format!("bad chunk size {hex:?}")))
}

fn parse_error(e: httparse::Error) -> io::Error {
    invalid(format!("malformed HTTP head: {e}"))
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn eof(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, msg)
}

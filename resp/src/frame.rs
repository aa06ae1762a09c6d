//! RESP frames, the incremental parser and the encoder.
//!
//! Wire format reminder (every line ends with `\r\n`):
//!
//! | type            | example                         | [`Frame`]                     |
//! |-----------------|---------------------------------|-------------------------------|
//! | simple string   | `+OK\r\n`                       | `Simple("OK")`                |
//! | error           | `-ERR boom\r\n`                 | `Error("ERR boom")`           |
//! | integer         | `:42\r\n`                       | `Integer(42)`                 |
//! | bulk string     | `$3\r\nfoo\r\n`                 | `Bulk(b"foo")`                |
//! | array           | `*2\r\n:1\r\n:2\r\n`            | `Array([Integer(1), ..])`     |
//! | null (RESP2)    | `$-1\r\n` / `*-1\r\n`           | `Null`                        |
//! | null (RESP3)    | `_\r\n`                         | `Null`                        |
//! | map (RESP3)     | `%1\r\n+k\r\n:1\r\n`            | `Map([(Simple("k"), ..)])`    |
//! | boolean (RESP3) | `#t\r\n` / `#f\r\n`             | `Boolean(true/false)`         |
//!
//! ## Memory note for servers
//!
//! The `Bytes` handed out by [`parse_request`] share the allocation of the
//! connection's read buffer. Keeping one of them alive (for example storing a
//! `SET` value as-is in the keyspace) keeps the *whole* read-buffer chunk it
//! came from alive. Copy values you retain long-term
//! (`Bytes::copy_from_slice`) unless they are large.

use std::borrow::Cow;
use std::fmt;

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// One RESP value.
///
/// Requests are always an `Array` of `Bulk` on the wire (`*2\r\n$3\r\nGET\r\n$1\r\nk\r\n`);
/// inline commands (`GET k\r\n`) are turned into the same thing by
/// [`parse_request`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Simple string: `+OK\r\n`. Must not contain `\r` or `\n`
    /// (the encoder replaces them with spaces). Borrowed when static (`OK`,
    /// `PONG`: no allocation per reply).
    Simple(Cow<'static, str>),
    /// Error: `-ERR unknown command 'FOO'\r\n`; holds the full text after `-`
    /// (`"ERR unknown command 'FOO'"`). `\r`/`\n` are replaced by spaces when encoding.
    Error(String),
    /// Integer: `:1\r\n`, `:-7\r\n`.
    Integer(i64),
    /// Binary-safe bulk string: `$3\r\nfoo\r\n` (empty: `$0\r\n\r\n`).
    Bulk(Bytes),
    /// Array: `*2\r\n$1\r\na\r\n:1\r\n` (empty: `*0\r\n`).
    Array(Vec<Frame>),
    /// Null. RESP2: `$-1\r\n` (`*-1\r\n` also parses to `Null`); RESP3: `_\r\n`.
    Null,
    /// RESP3 map: `%1\r\n$1\r\nk\r\n$1\r\nv\r\n`. Encoded as a flat array in RESP2
    /// (`*2\r\n$1\r\nk\r\n$1\r\nv\r\n`).
    Map(Vec<(Frame, Frame)>),
    /// RESP3 boolean: `#t\r\n` / `#f\r\n`. Encoded as `:1\r\n` / `:0\r\n` in RESP2.
    Boolean(bool),
}

/// Protocol version of a connection (`HELLO 2` / `HELLO 3`). Only affects
/// encoding: `Null` is `$-1\r\n` vs `_\r\n`, `Map` is `*2n` vs `%n`, `Boolean`
/// is `:1` vs `#t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Protocol {
    /// RESP2 (the default for new connections).
    #[default]
    Resp2,
    /// RESP3.
    Resp3,
}

/// Parser limits, with Redis-like defaults.
///
/// A bulk header `$<len>\r\n` with `len > max_bulk_len`, or an array/map header
/// `*<n>\r\n` with `n > max_array_len`, is rejected as soon as the digits show
/// it is too large (before the body arrives). An inline command line
/// (`PING\r\n`) longer than `max_inline_len` bytes is rejected.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Maximum bulk string length (Redis `proto-max-bulk-len`). Default 512 MiB.
    pub max_bulk_len: usize,
    /// Maximum number of elements of one array (pairs of one map). Default 1 Mi.
    pub max_array_len: usize,
    /// Maximum length of an inline command line, excluding `\n`. Default 64 KiB.
    pub max_inline_len: usize,
}

impl Default for Limits {
    /// `max_bulk_len` = 512 MiB, `max_array_len` = 1024 * 1024, `max_inline_len` = 64 KiB.
    fn default() -> Self {
        Limits { max_bulk_len: 512 * 1024 * 1024, max_array_len: 1024 * 1024, max_inline_len: 64 * 1024 }
    }
}

/// Maximum nesting depth of aggregates (`*`, `%`, `~`, `>`, `|`) accepted by
/// [`parse_frame`]. Deeper input (`*1\r\n*1\r\n*1\r\n...`) is a protocol error;
/// this keeps recursive `Drop`/`encode` of the resulting frame safe.
pub const MAX_NESTING_DEPTH: usize = 128;

/// Why parsing failed. In both cases the connection should be answered with
/// `-ERR Protocol error: <msg>\r\n` (see [`ParseError::to_frame`]) and closed,
/// as Redis does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// Malformed input, e.g. `*x\r\n` ("invalid multibulk length") or
    /// `*1\r\n:1\r\n` ("expected '$', got ':'").
    Protocol(String),
    /// A [`Limits`] value was exceeded, e.g. `$999999999999\r\n`
    /// ("invalid bulk length"), `*99999999\r\n` ("invalid multibulk length"),
    /// or an overlong inline line ("too big inline request").
    TooLarge(String),
}

impl ParseError {
    /// The message without the `Protocol error: ` prefix.
    pub fn message(&self) -> &str {
        match self {
            ParseError::Protocol(m) | ParseError::TooLarge(m) => m,
        }
    }

    /// The reply Redis sends before closing: `-ERR Protocol error: <msg>\r\n`.
    pub fn to_frame(&self) -> Frame {
        Frame::Error(format!("ERR Protocol error: {}", self.message()))
    }
}

impl fmt::Display for ParseError {
    /// Formats as `Protocol error: <msg>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Protocol error: {}", self.message())
    }
}

impl std::error::Error for ParseError {}

fn protocol(msg: impl Into<String>) -> ParseError {
    ParseError::Protocol(msg.into())
}

fn too_large(msg: impl Into<String>) -> ParseError {
    ParseError::TooLarge(msg.into())
}

const MSG_MULTIBULK: &str = "invalid multibulk length";
const MSG_BULK: &str = "invalid bulk length";
const MSG_INLINE: &str = "too big inline request";
const MSG_QUOTES: &str = "unbalanced quotes in request";
const MSG_CRLF: &str = "expected CRLF after bulk data";
const MSG_INTEGER: &str = "invalid integer";
/// Longest accepted run of digits in a length (u64::MAX has 20 digits).
const MAX_LEN_DIGITS: usize = 20;

// ---------------------------------------------------------------------------
// Low-level scanners. All of them validate eagerly: they return `Err` as soon
// as a byte proves the input invalid and `Ok(None)` while the input is a valid
// prefix, so feeding a valid stream byte by byte never produces an error.
// ---------------------------------------------------------------------------

/// Expects `\r\n` at `pos`. Returns the position after it.
fn expect_crlf(buf: &[u8], pos: usize, msg: &str) -> Result<Option<usize>, ParseError> {
    match buf.get(pos) {
        None => return Ok(None),
        Some(b'\r') => {}
        Some(_) => return Err(protocol(msg)),
    }
    match buf.get(pos + 1) {
        None => Ok(None),
        Some(b'\n') => Ok(Some(pos + 2)),
        Some(_) => Err(protocol(msg)),
    }
}

/// Parses `<len>\r\n` starting at `pos` (just after the type byte).
///
/// Accepts `0..=max`, plus `-1` when `allow_null` (returned as `None`).
/// Exceeding `max` is reported as soon as the digits show it.
/// Returns the length and the position after `\r\n`.
fn parse_len(buf: &[u8], pos: usize, max: usize, allow_null: bool, msg: &str) -> Result<Option<(Option<usize>, usize)>, ParseError> {
    let mut i = pos;
    if buf.get(i) == Some(&b'-') {
        if !allow_null {
            return Err(protocol(msg));
        }
        match buf.get(i + 1) {
            None => return Ok(None),
            Some(b'1') => {}
            Some(_) => return Err(protocol(msg)),
        }
        return Ok(expect_crlf(buf, i + 2, msg)?.map(|next| (None, next)));
    }
    let mut n: usize = 0;
    loop {
        match buf.get(i) {
            None => return Ok(None),
            Some(&c @ b'0'..=b'9') => {
                if i - pos >= MAX_LEN_DIGITS {
                    return Err(protocol(msg));
                }
                n = match n.checked_mul(10).and_then(|n| n.checked_add((c - b'0') as usize)) {
                    Some(n) if n <= max => n,
                    _ => return Err(too_large(msg)),
                };
                i += 1;
            }
            Some(b'\r') if i > pos => break,
            Some(_) => return Err(protocol(msg)),
        }
    }
    Ok(expect_crlf(buf, i, msg)?.map(|next| (Some(n), next)))
}

/// Parses a signed 64-bit integer line `[+-]<digits>\r\n` starting at `pos`.
fn parse_i64_line(buf: &[u8], pos: usize) -> Result<Option<(i64, usize)>, ParseError> {
    let mut i = pos;
    let mut neg = false;
    match buf.get(i) {
        None => return Ok(None),
        Some(b'-') => {
            neg = true;
            i += 1;
        }
        Some(b'+') => i += 1,
        Some(_) => {}
    }
    let digits_start = i;
    let mut n: u64 = 0;
    loop {
        match buf.get(i) {
            None => return Ok(None),
            Some(&c @ b'0'..=b'9') => {
                n = n
                    .checked_mul(10)
                    .and_then(|n| n.checked_add((c - b'0') as u64))
                    .filter(|&n| n <= i64::MAX as u64 + 1)
                    .ok_or_else(|| protocol(MSG_INTEGER))?;
                i += 1;
            }
            Some(b'\r') if i > digits_start => break,
            Some(_) => return Err(protocol(MSG_INTEGER)),
        }
    }
    let v = if neg {
        (n as i64).wrapping_neg() // n == 2^63 wraps to i64::MIN, as intended
    } else if n > i64::MAX as u64 {
        return Err(protocol(MSG_INTEGER));
    } else {
        n as i64
    };
    Ok(expect_crlf(buf, i, MSG_INTEGER)?.map(|next| (v, next)))
}

/// Finds a `\r\n`-terminated line starting at `pos` whose content must not
/// contain `\r`. Returns `(content_end, next)`.
fn read_line(buf: &[u8], pos: usize, max: usize) -> Result<Option<(usize, usize)>, ParseError> {
    let rest = buf.get(pos..).unwrap_or_default();
    let window = &rest[..rest.len().min(max.saturating_add(1))];
    match window.iter().position(|&b| b == b'\r') {
        Some(off) => {
            let end = pos + off;
            Ok(expect_crlf(buf, end, "invalid line terminator")?.map(|next| (end, next)))
        }
        None if rest.len() > max => Err(too_large("line too long")),
        None => Ok(None),
    }
}

/// Checks a bulk body of `len` bytes starting at `body` plus its `\r\n`.
/// Returns the position after the terminator.
fn bulk_end(buf: &[u8], body: usize, len: usize) -> Result<Option<usize>, ParseError> {
    let end = body + len;
    if buf.len() <= end {
        return Ok(None);
    }
    expect_crlf(buf, end, MSG_CRLF)
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n' | 0x0b | 0x0c)
}

// ---------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------

/// Parse one complete request from the front of `buf`.
///
/// A request is either
/// * a multibulk array of bulk strings: `*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n`, or
/// * an inline command (a line not starting with `*`): `GET key\r\n` (or `\n`),
///   split on whitespace, with Redis' `"double"` (with `\n`, `\xff`, ... escapes)
///   and `'single'` quoting.
///
/// Returns `Ok(None)` if more bytes are needed, leaving `buf` untouched
/// (except that empty inline lines, which are skipped, are consumed).
/// `Ok(Some(args))` consumes exactly the request's bytes; the arguments are
/// zero-copy slices of the buffer (quoted inline arguments with escapes are
/// the only copies). `*0\r\n` and `*-1\r\n` yield an empty `Vec`, which the
/// caller should ignore.
///
/// This function is stateless: if a request with very many arguments arrives
/// in many small reads, the already-received headers are re-scanned on every
/// call. [`RequestDecoder`] remembers its progress instead.
pub fn parse_request(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Vec<Bytes>>, ParseError> {
    RequestDecoder::new().decode(buf, limits)
}

/// Stateful version of [`parse_request`]: remembers how far into a partially
/// received multibulk request (`*3\r\n$3\r\nSET\r\n...`) it has validated, so
/// that each byte is scanned a bounded number of times however the request is
/// split across reads.
///
/// Use one decoder per connection, always with the same buffer, and only
/// append to the buffer between calls (or call [`RequestDecoder::reset`]).
#[derive(Clone, Debug, Default)]
pub struct RequestDecoder {
    /// A multibulk request is partially validated.
    active: bool,
    /// Number of arguments announced by `*<argc>\r\n`.
    argc: usize,
    /// Arguments not yet validated.
    remaining: usize,
    /// Offset of the next `$` header to validate.
    pos: usize,
    /// Where each validated argument's body starts, and its length.
    spans: Vec<(usize, usize)>,
}

impl RequestDecoder {
    /// A decoder with no request in progress.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forget any partially parsed request (call after discarding the buffer).
    pub fn reset(&mut self) {
        let mut spans = std::mem::take(&mut self.spans);
        spans.clear();
        *self = Self { spans, ..Self::default() };
    }

    /// Same contract as [`parse_request`]: `*1\r\n$4\r\nPING\r\n` or `PING\r\n`
    /// -> `Ok(Some(vec!["PING"]))`; `Ok(None)` when incomplete.
    pub fn decode(&mut self, buf: &mut BytesMut, limits: &Limits) -> Result<Option<Vec<Bytes>>, ParseError> {
        let res = self.decode_inner(buf, limits);
        if !matches!(res, Ok(None)) {
            self.reset();
        }
        res
    }

    fn decode_inner(&mut self, buf: &mut BytesMut, limits: &Limits) -> Result<Option<Vec<Bytes>>, ParseError> {
        if self.active && self.pos > buf.len() {
            // The caller broke the "append only" contract; start over.
            self.reset();
        }
        if !self.active {
            loop {
                match buf.first() {
                    None => return Ok(None),
                    Some(b'*') => break,
                    Some(_) => match parse_inline(buf, limits)? {
                        InlineResult::Incomplete => return Ok(None),
                        InlineResult::Empty => continue,
                        InlineResult::Args(args) => return Ok(Some(args)),
                    },
                }
            }
            if buf.get(1) == Some(&b'-') && buf.get(2..4) != Some(b"1\r") {
                // Like Redis, a request with a negative length (`*-10`) is
                // an empty one: skipped, and the connection goes on.
                let Some((_, next)) = parse_len(buf, 2, usize::MAX, false, MSG_MULTIBULK)? else { return Ok(None) };
                buf.advance(next);
                return Ok(Some(Vec::new()));
            }
            match parse_len(buf, 1, limits.max_array_len, true, MSG_MULTIBULK)? {
                None => return Ok(None),
                Some((None | Some(0), next)) => {
                    buf.advance(next);
                    return Ok(Some(Vec::new()));
                }
                Some((Some(argc), next)) => {
                    self.active = true;
                    self.argc = argc;
                    self.remaining = argc;
                    self.pos = next;
                }
            }
        }

        // Pass 1: validate every argument and find the end of the request.
        while self.remaining > 0 {
            let Some((len, body)) = bulk_header(buf, self.pos, limits.max_bulk_len)? else {
                return Ok(None);
            };
            let Some(next) = bulk_end(buf, body, len)? else {
                return Ok(None);
            };
            self.spans.push((body, len));
            self.pos = next;
            self.remaining -= 1;
        }

        // Pass 2: split the request off and slice the (validated) arguments.
        let frozen = buf.split_to(self.pos).freeze();
        Ok(Some(self.spans.iter().map(|&(body, len)| frozen.slice(body..body + len)).collect()))
    }
}

/// Parses a request argument header `$<len>\r\n` at `pos`.
fn bulk_header(buf: &[u8], pos: usize, max: usize) -> Result<Option<(usize, usize)>, ParseError> {
    match buf.get(pos) {
        None => return Ok(None),
        Some(b'$') => {}
        Some(&c) => return Err(protocol(format!("expected '$', got '{}'", (c as char).escape_default()))),
    }
    Ok(parse_len(buf, pos + 1, max, false, MSG_BULK)?.map(|(len, body)| (len.unwrap_or_default(), body)))
}

enum InlineResult {
    Incomplete,
    /// An empty (whitespace-only) line was consumed.
    Empty,
    Args(Vec<Bytes>),
}

/// Parses one inline command line at the front of `buf`.
fn parse_inline(buf: &mut BytesMut, limits: &Limits) -> Result<InlineResult, ParseError> {
    let max = limits.max_inline_len;
    let window = &buf[..buf.len().min(max.saturating_add(1))];
    let Some(nl) = window.iter().position(|&b| b == b'\n') else {
        return if buf.len() > max { Err(too_large(MSG_INLINE)) } else { Ok(InlineResult::Incomplete) };
    };
    // nl <= max here: the line (without '\n') fits the limit.
    let mut end = nl;
    if end > 0 && buf[end - 1] == b'\r' {
        end -= 1;
    }
    if buf[..end].iter().all(|&b| is_space(b)) {
        buf.advance(nl + 1);
        return Ok(InlineResult::Empty);
    }
    let line = buf.split_to(nl + 1).freeze().slice(..end);
    let args = split_inline(&line)?;
    Ok(InlineResult::Args(args))
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Splits an inline line like Redis' `sdssplitargs`. Unquoted arguments are
/// zero-copy slices of `line`.
fn split_inline(line: &Bytes) -> Result<Vec<Bytes>, ParseError> {
    let b = &line[..];
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        while i < b.len() && is_space(b[i]) {
            i += 1;
        }
        if i == b.len() {
            return Ok(out);
        }
        let start = i;
        while i < b.len() && !is_space(b[i]) && b[i] != b'"' && b[i] != b'\'' {
            i += 1;
        }
        if i == b.len() || is_space(b[i]) {
            out.push(line.slice(start..i));
            continue;
        }
        // Slow path: the argument contains quotes.
        let mut tok = b[start..i].to_vec();
        while i < b.len() && !is_space(b[i]) {
            let quote = b[i];
            if quote != b'"' && quote != b'\'' {
                tok.push(quote);
                i += 1;
                continue;
            }
            i += 1;
            loop {
                let Some(&c) = b.get(i) else {
                    return Err(protocol(MSG_QUOTES));
                };
                if c == quote {
                    i += 1;
                    // A closing quote must be followed by a space or the end.
                    if i < b.len() && !is_space(b[i]) {
                        return Err(protocol(MSG_QUOTES));
                    }
                    break;
                }
                if quote == b'"' && c == b'\\' && i + 1 < b.len() {
                    if b[i + 1] == b'x' && i + 3 < b.len() {
                        if let (Some(h), Some(l)) = (hex_val(b[i + 2]), hex_val(b[i + 3])) {
                            tok.push(h * 16 + l);
                            i += 4;
                            continue;
                        }
                    }
                    tok.push(match b[i + 1] {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => 0x08,
                        b'a' => 0x07,
                        other => other,
                    });
                    i += 2;
                } else if quote == b'\'' && c == b'\\' && b.get(i + 1) == Some(&b'\'') {
                    tok.push(b'\'');
                    i += 2;
                } else {
                    tok.push(c);
                    i += 1;
                }
            }
            break;
        }
        out.push(Bytes::from(tok));
    }
}

// ---------------------------------------------------------------------------
// Replies (any frame)
// ---------------------------------------------------------------------------

/// One header/scalar item as seen on the wire.
enum Item {
    Scalar(Scalar),
    /// `*n`, `~n`, `>n` (n elements)
    Array(usize),
    /// `%n` (n pairs)
    Map(usize),
    /// `|n` attribute (n pairs), discarded
    Attr(usize),
}

enum Scalar {
    Simple(usize, usize),
    Error(usize, usize),
    Integer(i64),
    Bulk(usize, usize),
    Null,
    Boolean(bool),
}

/// Reads one item at `pos`. Returns it and the position after it.
fn read_item(buf: &[u8], pos: usize, limits: &Limits) -> Result<Option<(Item, usize)>, ParseError> {
    let Some(&t) = buf.get(pos) else {
        return Ok(None);
    };
    let p = pos + 1;
    let line_max = limits.max_bulk_len;
    let item = match t {
        b'+' | b'-' | b',' | b'(' => {
            let Some((end, next)) = read_line(buf, p, line_max)? else {
                return Ok(None);
            };
            let s = if t == b'-' { Scalar::Error(p, end) } else { Scalar::Simple(p, end) };
            (Item::Scalar(s), next)
        }
        b':' => match parse_i64_line(buf, p)? {
            None => return Ok(None),
            Some((v, next)) => (Item::Scalar(Scalar::Integer(v)), next),
        },
        b'$' | b'=' | b'!' => {
            let allow_null = t == b'$';
            let Some((len, body)) = parse_len(buf, p, limits.max_bulk_len, allow_null, MSG_BULK)? else {
                return Ok(None);
            };
            let Some(len) = len else {
                return Ok(Some((Item::Scalar(Scalar::Null), body)));
            };
            let Some(next) = bulk_end(buf, body, len)? else {
                return Ok(None);
            };
            let (mut start, end) = (body, body + len);
            let s = match t {
                b'!' => Scalar::Error(start, end),
                b'=' => {
                    // Verbatim string "txt:<content>": drop the format prefix.
                    if len >= 4 && buf[start + 3] == b':' {
                        start += 4;
                    }
                    Scalar::Bulk(start, end)
                }
                _ => Scalar::Bulk(start, end),
            };
            (Item::Scalar(s), next)
        }
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let allow_null = t == b'*';
            let Some((n, next)) = parse_len(buf, p, limits.max_array_len, allow_null, MSG_MULTIBULK)? else {
                return Ok(None);
            };
            let item = match (t, n) {
                (_, None) => Item::Scalar(Scalar::Null),
                (b'%', Some(n)) => Item::Map(n),
                (b'|', Some(n)) => Item::Attr(n),
                (_, Some(n)) => Item::Array(n),
            };
            (item, next)
        }
        b'_' => match expect_crlf(buf, p, "invalid null")? {
            None => return Ok(None),
            Some(next) => (Item::Scalar(Scalar::Null), next),
        },
        b'#' => {
            let v = match buf.get(p) {
                None => return Ok(None),
                Some(b't') => true,
                Some(b'f') => false,
                Some(_) => return Err(protocol("invalid boolean")),
            };
            match expect_crlf(buf, p + 1, "invalid boolean")? {
                None => return Ok(None),
                Some(next) => (Item::Scalar(Scalar::Boolean(v)), next),
            }
        }
        other => return Err(protocol(format!("invalid frame type '{}'", (other as char).escape_default()))),
    };
    Ok(Some(item))
}

/// Parse one complete reply frame from the front of `buf`; used by clients.
///
/// Understands RESP2 and RESP3: `+` `-` `:` `$` `*` `_` `%` `#`, with
/// `$-1\r\n` / `*-1\r\n` parsed as [`Frame::Null`]. The other RESP3 types are
/// mapped onto the existing variants: sets `~` and pushes `>` become `Array`,
/// doubles `,` and big numbers `(` become `Simple` (their text), verbatim
/// strings `=` become `Bulk` (without the `txt:` prefix), blob errors `!`
/// become `Error`, and attributes `|` are skipped.
///
/// Returns `Ok(None)` if incomplete (buf untouched); otherwise consumes
/// exactly the frame's bytes. Bulk payloads are zero-copy slices of `buf`.
pub fn parse_frame(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Frame>, ParseError> {
    FrameDecoder::new().decode(buf, limits)
}

/// Stateful version of [`parse_frame`] that remembers how much of a large,
/// partially received reply (`*1000000\r\n...`) it has already validated.
///
/// Use one decoder per connection with the same buffer, and only append to
/// the buffer between calls (or call [`FrameDecoder::reset`]).
#[derive(Clone, Debug, Default)]
pub struct FrameDecoder {
    /// Offset of the next item to validate.
    pos: usize,
    /// Open aggregates: (items still expected, is an attribute).
    stack: Vec<(usize, bool)>,
}

impl FrameDecoder {
    /// A decoder with no frame in progress.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forget any partially parsed frame.
    pub fn reset(&mut self) {
        self.pos = 0;
        self.stack.clear();
    }

    /// Same contract as [`parse_frame`]: `+OK\r\n` -> `Ok(Some(Frame::Simple("OK")))`.
    pub fn decode(&mut self, buf: &mut BytesMut, limits: &Limits) -> Result<Option<Frame>, ParseError> {
        if self.pos > buf.len() {
            self.reset();
        }
        let res = self.decode_inner(buf, limits);
        if !matches!(res, Ok(None)) {
            self.reset();
        }
        res
    }

    fn decode_inner(&mut self, buf: &mut BytesMut, limits: &Limits) -> Result<Option<Frame>, ParseError> {
        // Pass 1: find the end of the frame.
        loop {
            let Some((item, next)) = read_item(buf, self.pos, limits)? else {
                return Ok(None);
            };
            self.pos = next;
            let open = match item {
                Item::Scalar(_) | Item::Array(0) | Item::Map(0) => None,
                Item::Attr(0) => continue,
                Item::Array(n) => Some((n, false)),
                Item::Map(n) => Some((pairs(n)?, false)),
                Item::Attr(n) => Some((pairs(n)?, true)),
            };
            if let Some(open) = open {
                if self.stack.len() >= MAX_NESTING_DEPTH {
                    return Err(protocol("too deeply nested reply"));
                }
                self.stack.push(open);
                continue;
            }
            // A value completed: close finished aggregates.
            loop {
                let Some(top) = self.stack.last_mut() else {
                    return Ok(Some(build_frame(buf.split_to(self.pos).freeze(), limits)?));
                };
                top.0 -= 1;
                if top.0 > 0 {
                    break;
                }
                let (_, is_attr) = self.stack.pop().unwrap_or_default();
                if is_attr {
                    break; // an attribute is not a value of its parent
                }
            }
        }
    }
}

fn pairs(n: usize) -> Result<usize, ParseError> {
    n.checked_mul(2).ok_or_else(|| too_large(MSG_MULTIBULK))
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

enum Open {
    Array(Vec<Frame>),
    Map(Vec<(Frame, Frame)>, Option<Frame>),
    Attr,
}

/// Pass 2 of [`FrameDecoder`]: builds the frame from a buffer known to hold
/// exactly one complete, valid frame. Iterative, so depth is not a concern here.
fn build_frame(data: Bytes, limits: &Limits) -> Result<Frame, ParseError> {
    // (aggregate being filled, items still expected)
    let mut stack: Vec<(Open, usize)> = Vec::new();
    let mut pos = 0;
    loop {
        let (item, next) = read_item(&data, pos, limits)?.ok_or_else(|| protocol("reply changed while parsing"))?;
        pos = next;
        let mut value = match item {
            Item::Scalar(s) => Some(match s {
                Scalar::Simple(a, b) => Frame::Simple(lossy(&data[a..b]).into()),
                Scalar::Error(a, b) => Frame::Error(lossy(&data[a..b])),
                Scalar::Integer(v) => Frame::Integer(v),
                Scalar::Bulk(a, b) => Frame::Bulk(data.slice(a..b)),
                Scalar::Null => Frame::Null,
                Scalar::Boolean(v) => Frame::Boolean(v),
            }),
            Item::Array(0) => Some(Frame::Array(Vec::new())),
            Item::Map(0) => Some(Frame::Map(Vec::new())),
            Item::Attr(0) => None,
            Item::Array(n) => {
                stack.push((Open::Array(Vec::with_capacity(n)), n));
                None
            }
            Item::Map(n) => {
                stack.push((Open::Map(Vec::with_capacity(n), None), pairs(n)?));
                None
            }
            Item::Attr(n) => {
                stack.push((Open::Attr, pairs(n)?));
                None
            }
        };
        while let Some(v) = value.take() {
            let Some((open, left)) = stack.last_mut() else {
                return Ok(v);
            };
            match open {
                Open::Array(items) => items.push(v),
                Open::Map(entries, key) => match key.take() {
                    None => *key = Some(v),
                    Some(k) => entries.push((k, v)),
                },
                Open::Attr => {}
            }
            *left -= 1;
            if *left == 0 {
                if let Some((open, _)) = stack.pop() {
                    value = match open {
                        Open::Array(items) => Some(Frame::Array(items)),
                        Open::Map(entries, _) => Some(Frame::Map(entries)),
                        Open::Attr => None,
                    };
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------

/// Formats `v` in decimal into `tmp`, returning the used tail.
fn fmt_u64(mut v: u64, tmp: &mut [u8; 20]) -> &[u8] {
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return &tmp[i..];
        }
    }
}

/// Appends `<prefix><v>\r\n` (v unsigned).
fn put_len(out: &mut BytesMut, prefix: u8, v: usize) {
    let mut tmp = [0u8; 20];
    let digits = fmt_u64(v as u64, &mut tmp);
    out.reserve(digits.len() + 3);
    out.put_u8(prefix);
    out.extend_from_slice(digits);
    out.extend_from_slice(b"\r\n");
}

/// Appends `<prefix><text>\r\n`, replacing `\r` and `\n` in `text` with spaces.
fn put_line(out: &mut BytesMut, prefix: u8, text: &[u8]) {
    out.reserve(text.len() + 3);
    out.put_u8(prefix);
    if text.iter().any(|&b| b == b'\r' || b == b'\n') {
        out.extend(text.iter().map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }));
    } else {
        out.extend_from_slice(text);
    }
    out.extend_from_slice(b"\r\n");
}

/// Appends a simple string: `+OK\r\n`. `\r`/`\n` in `s` become spaces.
pub fn encode_simple(s: &str, out: &mut BytesMut) {
    put_line(out, b'+', s.as_bytes());
}

/// Appends an error: `-ERR wrong number of arguments\r\n` for
/// `"ERR wrong number of arguments"`. `\r`/`\n` in `msg` become spaces.
pub fn encode_error(msg: &str, out: &mut BytesMut) {
    put_line(out, b'-', msg.as_bytes());
}

/// Appends an integer: `:42\r\n`, `:-1\r\n`.
pub fn encode_integer(v: i64, out: &mut BytesMut) {
    let mut tmp = [0u8; 20];
    let digits = fmt_u64(v.unsigned_abs(), &mut tmp);
    out.reserve(digits.len() + 4);
    out.put_u8(b':');
    if v < 0 {
        out.put_u8(b'-');
    }
    out.extend_from_slice(digits);
    out.extend_from_slice(b"\r\n");
}

/// Appends a bulk string: `$3\r\nfoo\r\n` (binary safe).
pub fn encode_bulk(data: &[u8], out: &mut BytesMut) {
    out.reserve(data.len() + 24);
    put_len(out, b'$', data.len());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Appends a null: `$-1\r\n` (RESP2) or `_\r\n` (RESP3).
pub fn encode_null(proto: Protocol, out: &mut BytesMut) {
    out.extend_from_slice(match proto {
        Protocol::Resp2 => b"$-1\r\n",
        Protocol::Resp3 => b"_\r\n",
    });
}

/// Appends a RESP2 null array `*-1\r\n` (what Redis sends e.g. for a timed-out
/// `BLPOP` in RESP2), or `_\r\n` in RESP3.
pub fn encode_null_array(proto: Protocol, out: &mut BytesMut) {
    out.extend_from_slice(match proto {
        Protocol::Resp2 => b"*-1\r\n",
        Protocol::Resp3 => b"_\r\n",
    });
}

/// Appends an array header `*<n>\r\n`; the caller then encodes `n` elements.
pub fn encode_array_len(n: usize, out: &mut BytesMut) {
    put_len(out, b'*', n);
}

/// Appends a map header for `n` pairs: `%<n>\r\n` (RESP3) or `*<2n>\r\n`
/// (RESP2); the caller then encodes `2n` elements (key, value, ...).
pub fn encode_map_len(n: usize, proto: Protocol, out: &mut BytesMut) {
    match proto {
        Protocol::Resp2 => put_len(out, b'*', n * 2),
        Protocol::Resp3 => put_len(out, b'%', n),
    }
}

/// Appends a boolean: `#t\r\n`/`#f\r\n` (RESP3) or `:1\r\n`/`:0\r\n` (RESP2).
pub fn encode_bool(v: bool, proto: Protocol, out: &mut BytesMut) {
    out.extend_from_slice(match (proto, v) {
        (Protocol::Resp2, true) => b":1\r\n",
        (Protocol::Resp2, false) => b":0\r\n",
        (Protocol::Resp3, true) => b"#t\r\n",
        (Protocol::Resp3, false) => b"#f\r\n",
    });
}

/// Encode a request (array of bulk strings) for a client to send:
/// `["GET", "k"]` -> `*2\r\n$3\r\nGET\r\n$1\r\nk\r\n`.
pub fn encode_request(args: &[&[u8]], out: &mut BytesMut) {
    let payload: usize = args.iter().map(|a| a.len() + 16).sum();
    out.reserve(payload + 16);
    encode_array_len(args.len(), out);
    for a in args {
        encode_bulk(a, out);
    }
}

impl Frame {
    /// Append the wire encoding for `proto` to `out`.
    ///
    /// Identical in both protocols except: `Null` is `$-1\r\n` (RESP2) vs
    /// `_\r\n` (RESP3); `Map` is a flat array `*<2n>\r\n k v ...` (RESP2) vs
    /// `%<n>\r\n k v ...` (RESP3); `Boolean` is `:1\r\n`/`:0\r\n` (RESP2) vs
    /// `#t\r\n`/`#f\r\n` (RESP3). Never allocates besides growing `out`.
    pub fn encode(&self, proto: Protocol, out: &mut BytesMut) {
        match self {
            Frame::Simple(s) => encode_simple(s, out),
            Frame::Error(s) => encode_error(s, out),
            Frame::Integer(v) => encode_integer(*v, out),
            Frame::Bulk(b) => encode_bulk(b, out),
            Frame::Array(items) => {
                encode_array_len(items.len(), out);
                for f in items {
                    f.encode(proto, out);
                }
            }
            Frame::Null => encode_null(proto, out),
            Frame::Map(entries) => {
                encode_map_len(entries.len(), proto, out);
                for (k, v) in entries {
                    k.encode(proto, out);
                    v.encode(proto, out);
                }
            }
            Frame::Boolean(v) => encode_bool(*v, proto, out),
        }
    }

    /// `+OK\r\n`: `Frame::Simple("OK")`.
    pub fn ok() -> Frame {
        Frame::Simple(Cow::Borrowed("OK"))
    }

    /// An error reply; `msg` is the full text after `-`, including the code:
    /// `Frame::error("ERR syntax error")` encodes as `-ERR syntax error\r\n`.
    pub fn error(msg: impl Into<String>) -> Frame {
        Frame::Error(msg.into())
    }

    /// A bulk string: `Frame::bulk("foo")` encodes as `$3\r\nfoo\r\n`.
    pub fn bulk(b: impl Into<Bytes>) -> Frame {
        Frame::Bulk(b.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lim() -> Limits {
        Limits::default()
    }

    fn req(input: &[u8]) -> Result<Option<Vec<Bytes>>, ParseError> {
        let mut buf = BytesMut::from(input);
        parse_request(&mut buf, &lim())
    }

    fn args(v: &[&str]) -> Vec<Bytes> {
        v.iter().map(|s| Bytes::copy_from_slice(s.as_bytes())).collect()
    }

    /// Parses every request in `input` at once.
    fn all_requests(input: &[u8], limits: &Limits) -> Result<Vec<Vec<Bytes>>, ParseError> {
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        while let Some(r) = parse_request(&mut buf, limits)? {
            out.push(r);
        }
        Ok(out)
    }

    /// Feeds `input` one byte at a time, parsing after each byte.
    fn bytewise_requests(input: &[u8], limits: &Limits, mut decoder: Option<&mut RequestDecoder>) -> Result<Vec<Vec<Bytes>>, ParseError> {
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for &b in input {
            buf.put_u8(b);
            loop {
                let before = buf.clone();
                let r = match decoder.as_deref_mut() {
                    Some(d) => d.decode(&mut buf, limits)?,
                    None => parse_request(&mut buf, limits)?,
                };
                match r {
                    Some(r) => out.push(r),
                    None => {
                        // Untouched, except for skipped blank inline lines.
                        assert!(before.ends_with(&buf));
                        break;
                    }
                }
            }
        }
        assert!(buf.iter().all(|&b| b != b'\n'), "leftover: {buf:?}");
        Ok(out)
    }

    fn encoded(f: &Frame, proto: Protocol) -> Vec<u8> {
        let mut out = BytesMut::new();
        f.encode(proto, &mut out);
        out.to_vec()
    }

    fn frame(input: &[u8]) -> Result<Option<Frame>, ParseError> {
        let mut buf = BytesMut::from(input);
        let r = parse_frame(&mut buf, &lim());
        if let Ok(Some(_)) = r {
            assert!(buf.is_empty(), "frame did not consume everything");
        }
        r
    }

    // ----- requests -----

    #[test]
    fn multibulk_request() {
        assert_eq!(req(b"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n").unwrap(), Some(args(&["GET", "key"])));
        assert_eq!(req(b"*1\r\n$0\r\n\r\n").unwrap(), Some(args(&[""])));
    }

    #[test]
    fn request_consumes_exactly_one() {
        let mut buf = BytesMut::from(&b"*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nPI"[..]);
        assert_eq!(parse_request(&mut buf, &lim()).unwrap(), Some(args(&["PING"])));
        assert_eq!(&buf[..], b"*1\r\n$4\r\nPI");
        assert_eq!(parse_request(&mut buf, &lim()).unwrap(), None);
        assert_eq!(&buf[..], b"*1\r\n$4\r\nPI");
    }

    #[test]
    fn pipelined_requests() {
        let input = b"*1\r\n$4\r\nPING\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\nPING\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n";
        assert_eq!(
            all_requests(input, &lim()).unwrap(),
            vec![args(&["PING"]), args(&["SET", "k", "v"]), args(&["PING"]), args(&["GET", "k"]),]
        );
    }

    #[test]
    fn binary_safe_bulk() {
        let mut buf = BytesMut::from(&b"*2\r\n$3\r\nSET\r\n$6\r\na\r\n\0\nb\r\n"[..]);
        let r = parse_request(&mut buf, &lim()).unwrap().unwrap();
        assert_eq!(r[1], Bytes::from_static(b"a\r\n\0\nb"));
        assert!(buf.is_empty());
    }

    #[test]
    fn zero_copy_args() {
        let mut buf = BytesMut::with_capacity(64);
        buf.extend_from_slice(b"*2\r\n$3\r\nGET\r\n$5\r\nhello\r\nPING x\r\n");
        let range = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.len();
        let r = parse_request(&mut buf, &lim()).unwrap().unwrap();
        for a in &r {
            assert!(range.contains(&(a.as_ptr() as usize)));
        }
        let r = parse_request(&mut buf, &lim()).unwrap().unwrap();
        assert_eq!(r, args(&["PING", "x"]));
        for a in &r {
            assert!(range.contains(&(a.as_ptr() as usize)));
        }
    }

    #[test]
    fn a_negative_multibulk_length_is_an_empty_request() {
        let limits = Limits::default();
        let mut buf = BytesMut::from(&b"*-10\r\n*1\r\n$4\r\nPING\r\n"[..]);
        let mut d = RequestDecoder::new();
        assert_eq!(d.decode(&mut buf, &limits).unwrap(), Some(Vec::new()));
        assert_eq!(d.decode(&mut buf, &limits).unwrap(), Some(vec![Bytes::from("PING")]));
        let mut partial = BytesMut::from(&b"*-12"[..]);
        assert_eq!(d.decode(&mut partial, &limits).unwrap(), None);
        let mut bad = BytesMut::from(&b"*-1x\r\n"[..]);
        assert!(d.decode(&mut bad, &limits).is_err());
    }

    #[test]
    fn empty_and_null_multibulk() {
        let mut buf = BytesMut::from(&b"*0\r\n*-1\r\n*1\r\n$1\r\na\r\n"[..]);
        assert_eq!(parse_request(&mut buf, &lim()).unwrap(), Some(vec![]));
        assert_eq!(parse_request(&mut buf, &lim()).unwrap(), Some(vec![]));
        assert_eq!(parse_request(&mut buf, &lim()).unwrap(), Some(args(&["a"])));
        assert!(buf.is_empty());
    }

    #[test]
    fn inline_requests() {
        assert_eq!(req(b"PING\r\n").unwrap(), Some(args(&["PING"])));
        assert_eq!(req(b"PING\n").unwrap(), Some(args(&["PING"])));
        assert_eq!(req(b"  SET\tk   v \r\n").unwrap(), Some(args(&["SET", "k", "v"])));
        assert_eq!(req(b"PING").unwrap(), None);
        assert_eq!(req(b"PING\r").unwrap(), None);
        // Empty lines are skipped (and consumed).
        let mut buf = BytesMut::from(&b"\r\n\n  \r\nPING\r\n\r\n"[..]);
        assert_eq!(parse_request(&mut buf, &lim()).unwrap(), Some(args(&["PING"])));
        assert_eq!(parse_request(&mut buf, &lim()).unwrap(), None);
        assert!(buf.is_empty());
    }

    #[test]
    fn inline_quotes() {
        assert_eq!(req(b"SET \"hello world\" 'it''s'\r\n").unwrap_err(), protocol(MSG_QUOTES));
        assert_eq!(req(b"SET \"a b\\n\\x41\\\"\" 'it\\'s' x\"y z\"\r\n").unwrap(), Some(args(&["SET", "a b\nA\"", "it's", "xy z"])));
        assert_eq!(req(b"SET \"\" ''\r\n").unwrap(), Some(args(&["SET", "", ""])));
        assert_eq!(req(b"SET \"abc\r\n").unwrap_err(), protocol(MSG_QUOTES));
        assert_eq!(req(b"SET 'abc\r\n").unwrap_err(), protocol(MSG_QUOTES));
        assert_eq!(req(b"SET \"a\"b\r\n").unwrap_err(), protocol(MSG_QUOTES));
        assert_eq!(req(b"SET \"\\xZZ\"\r\n").unwrap(), Some(args(&["SET", "xZZ"])));
    }

    #[test]
    fn inline_limit() {
        let limits = Limits { max_inline_len: 10, ..Limits::default() };
        let mut buf = BytesMut::from(&b"0123456789"[..]);
        assert_eq!(parse_request(&mut buf, &limits).unwrap(), None);
        buf.put_u8(b'a');
        assert_eq!(parse_request(&mut buf, &limits).unwrap_err(), too_large(MSG_INLINE));
        // A complete line of exactly the limit is fine, one more byte is not.
        let mut buf = BytesMut::from(&b"012345678 \nX"[..]);
        assert_eq!(parse_request(&mut buf, &limits).unwrap(), Some(args(&["012345678"])));
        let mut buf = BytesMut::from(&b"0123456789a\n"[..]);
        assert_eq!(parse_request(&mut buf, &limits).unwrap_err(), too_large(MSG_INLINE));
    }

    #[test]
    fn malformed_requests() {
        let cases: &[(&[u8], ParseError)] = &[
            (b"*2\r\n$3\r\nfoo\r\n:1\r\n", protocol("expected '$', got ':'")),
            (b"*x\r\n", protocol(MSG_MULTIBULK)),
            (b"*\r\n", protocol(MSG_MULTIBULK)),
            (b"*1x", protocol(MSG_MULTIBULK)),
            (b"*1\rx", protocol(MSG_MULTIBULK)),
            (b"*-1x", protocol(MSG_MULTIBULK)),
            (b"*1\r\n$-5\r\n", protocol(MSG_BULK)),
            (b"*1\r\n$-1\r\n", protocol(MSG_BULK)),
            (b"*1\r\n$x\r\n", protocol(MSG_BULK)),
            (b"*1\r\n$\r\n", protocol(MSG_BULK)),
            (b"*1\r\n$+3\r\n", protocol(MSG_BULK)),
            (b"*1\r\n$3\r\nfooXX", protocol(MSG_CRLF)),
            (b"*2\r\n$3\r\nfooXX", protocol(MSG_CRLF)),
            (b"*1\r\n$3\r\nfoo\rX", protocol(MSG_CRLF)),
            (b"*1\r\n$3\r\nfoo\n\r", protocol(MSG_CRLF)),
            (b"*1\r\n*1\r\n", protocol("expected '$', got '*'")),
            (b"*1\r\n\x01", protocol("expected '$', got '\\u{1}'")),
            (b"*000000000000000000000001\r\n", protocol(MSG_MULTIBULK)),
        ];
        for (input, err) in cases {
            assert_eq!(req(input).unwrap_err(), *err, "input {:?}", String::from_utf8_lossy(input));
        }
    }

    #[test]
    fn limits_enforced_before_body() {
        // Default limit: a 10 GB announcement is rejected without any body.
        assert_eq!(req(b"*1\r\n$10000000000\r\n").unwrap_err(), too_large(MSG_BULK));
        // ... even before the header line is complete.
        assert_eq!(req(b"*1\r\n$10000000000").unwrap_err(), too_large(MSG_BULK));
        assert_eq!(req(b"*1\r\n$99999999999999999999999999").unwrap_err(), too_large(MSG_BULK));
        let limits = Limits { max_bulk_len: 10, max_array_len: 3, ..Limits::default() };
        let parse = |input: &[u8]| parse_request(&mut BytesMut::from(input), &limits);
        assert_eq!(parse(b"*1\r\n$10\r\n").unwrap(), None);
        assert_eq!(parse(b"*1\r\n$11\r\n").unwrap_err(), too_large(MSG_BULK));
        assert_eq!(parse(b"*3\r\n").unwrap(), None);
        assert_eq!(parse(b"*4\r\n").unwrap_err(), too_large(MSG_MULTIBULK));
        assert_eq!(parse(b"*1\r\n$0\r\n\r\n*4").unwrap(), Some(args(&[""])));
    }

    #[test]
    fn incomplete_leaves_buffer_untouched() {
        let full: &[u8] = b"*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$5\r\nvalue\r\n";
        for cut in 0..full.len() {
            let mut buf = BytesMut::from(&full[..cut]);
            assert_eq!(parse_request(&mut buf, &lim()).unwrap(), None, "cut {cut}");
            assert_eq!(&buf[..], &full[..cut]);
        }
    }

    #[test]
    fn crlf_split_across_reads() {
        let mut buf = BytesMut::from(&b"*1\r\n$3\r\nfoo"[..]);
        let mut dec = RequestDecoder::new();
        assert_eq!(dec.decode(&mut buf, &lim()).unwrap(), None);
        buf.extend_from_slice(b"\r");
        assert_eq!(dec.decode(&mut buf, &lim()).unwrap(), None);
        buf.extend_from_slice(b"\n");
        assert_eq!(dec.decode(&mut buf, &lim()).unwrap(), Some(args(&["foo"])));
        assert!(buf.is_empty());
    }

    fn request_stream() -> Vec<u8> {
        let mut s = Vec::new();
        let mut out = BytesMut::new();
        encode_request(&[b"SET", b"key", b"va\r\nl\0ue"], &mut out);
        encode_request(&[b"PING"], &mut out);
        encode_request(&[], &mut out);
        encode_request(&[b"", b"x"], &mut out);
        s.extend_from_slice(&out);
        s.extend_from_slice(b"\r\n\nGET  'a b' \"c\\x41\"\r\n*-1\r\nINFO\n");
        s.extend_from_slice(b"*2\r\n$4\r\nMGET\r\n$10\r\n0123456789\r\n");
        s
    }

    #[test]
    fn bytewise_equals_whole() {
        let input = request_stream();
        let whole = all_requests(&input, &lim()).unwrap();
        assert_eq!(whole.len(), 8);
        assert_eq!(whole[4], args(&["GET", "a b", "cA"]));
        assert_eq!(bytewise_requests(&input, &lim(), None).unwrap(), whole);
        let mut dec = RequestDecoder::new();
        assert_eq!(bytewise_requests(&input, &lim(), Some(&mut dec)).unwrap(), whole);
        // Arbitrary chunkings with a persistent decoder.
        for chunk in 1..input.len() {
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            for piece in input.chunks(chunk) {
                buf.extend_from_slice(piece);
                while let Some(r) = dec.decode(&mut buf, &lim()).unwrap() {
                    got.push(r);
                }
            }
            assert_eq!(got, whole, "chunk {chunk}");
        }
    }

    #[test]
    fn bytewise_invalid_stream_errors_too() {
        for input in [&b"*2\r\n$3\r\nfoo\r\n:1\r\n"[..], b"*1\r\n$3\r\nfooXX"] {
            assert!(bytewise_requests(input, &lim(), None).is_err());
            let mut dec = RequestDecoder::new();
            assert!(bytewise_requests(input, &lim(), Some(&mut dec)).is_err());
        }
    }

    #[test]
    fn decoder_resumes_large_requests() {
        // Many arguments arriving in small pieces: the decoder must give the
        // same result as a one-shot parse.
        let n = 2000;
        let owned: Vec<Vec<u8>> = (0..n).map(|i| format!("k{i}").into_bytes()).collect();
        let refs: Vec<&[u8]> = owned.iter().map(|v| v.as_slice()).collect();
        let mut wire = BytesMut::new();
        encode_request(&refs, &mut wire);
        let mut dec = RequestDecoder::new();
        let mut buf = BytesMut::new();
        let mut result = None;
        for piece in wire.chunks(7) {
            assert!(result.is_none());
            buf.extend_from_slice(piece);
            result = dec.decode(&mut buf, &lim()).unwrap();
        }
        let result = result.unwrap();
        assert_eq!(result.len(), n);
        assert_eq!(result[1234], Bytes::from_static(b"k1234"));
        assert!(buf.is_empty());
        // A decoder is reusable after an error + reset.
        let mut buf = BytesMut::from(&b"*1\r\n:"[..]);
        assert!(dec.decode(&mut buf, &lim()).is_err());
        let mut buf = BytesMut::from(&b"*1\r\n$1\r\na\r\n"[..]);
        assert_eq!(dec.decode(&mut buf, &lim()).unwrap(), Some(args(&["a"])));
    }

    #[test]
    fn parse_error_reply() {
        let e = too_large(MSG_BULK);
        assert_eq!(e.to_string(), "Protocol error: invalid bulk length");
        assert_eq!(encoded(&e.to_frame(), Protocol::Resp2), b"-ERR Protocol error: invalid bulk length\r\n");
    }

    // ----- encoding -----

    #[test]
    fn encode_scalars() {
        for proto in [Protocol::Resp2, Protocol::Resp3] {
            assert_eq!(encoded(&Frame::ok(), proto), b"+OK\r\n");
            assert_eq!(encoded(&Frame::error("ERR unknown command 'FOO'"), proto), b"-ERR unknown command 'FOO'\r\n");
            assert_eq!(encoded(&Frame::error("ERR bad\r\nline"), proto), b"-ERR bad  line\r\n");
            assert_eq!(encoded(&Frame::Integer(0), proto), b":0\r\n");
            assert_eq!(encoded(&Frame::Integer(-42), proto), b":-42\r\n");
            assert_eq!(encoded(&Frame::Integer(i64::MIN), proto), b":-9223372036854775808\r\n");
            assert_eq!(encoded(&Frame::Integer(i64::MAX), proto), b":9223372036854775807\r\n");
            assert_eq!(encoded(&Frame::bulk("foo"), proto), b"$3\r\nfoo\r\n");
            assert_eq!(encoded(&Frame::bulk(""), proto), b"$0\r\n\r\n");
            assert_eq!(encoded(&Frame::Array(vec![]), proto), b"*0\r\n");
        }
    }

    #[test]
    fn encode_protocol_differences() {
        use Protocol::*;
        assert_eq!(encoded(&Frame::Null, Resp2), b"$-1\r\n");
        assert_eq!(encoded(&Frame::Null, Resp3), b"_\r\n");
        assert_eq!(encoded(&Frame::Boolean(true), Resp2), b":1\r\n");
        assert_eq!(encoded(&Frame::Boolean(false), Resp2), b":0\r\n");
        assert_eq!(encoded(&Frame::Boolean(true), Resp3), b"#t\r\n");
        assert_eq!(encoded(&Frame::Boolean(false), Resp3), b"#f\r\n");
        let map = Frame::Map(vec![(Frame::bulk("a"), Frame::Integer(1)), (Frame::bulk("b"), Frame::Null)]);
        assert_eq!(encoded(&map, Resp2), b"*4\r\n$1\r\na\r\n:1\r\n$1\r\nb\r\n$-1\r\n");
        assert_eq!(encoded(&map, Resp3), b"%2\r\n$1\r\na\r\n:1\r\n$1\r\nb\r\n_\r\n");
        let mut out = BytesMut::new();
        encode_null_array(Resp2, &mut out);
        encode_null_array(Resp3, &mut out);
        assert_eq!(&out[..], b"*-1\r\n_\r\n");
    }

    #[test]
    fn encode_request_wire() {
        let mut out = BytesMut::new();
        encode_request(&[b"GET", b"k"], &mut out);
        assert_eq!(&out[..], b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
        let mut buf = out.clone();
        assert_eq!(parse_request(&mut buf, &lim()).unwrap(), Some(args(&["GET", "k"])));
    }

    // ----- reply frames -----

    #[test]
    fn parse_reply_types() {
        assert_eq!(frame(b"+OK\r\n").unwrap(), Some(Frame::ok()));
        assert_eq!(frame(b"-ERR no\r\n").unwrap(), Some(Frame::error("ERR no")));
        assert_eq!(frame(b":-12\r\n").unwrap(), Some(Frame::Integer(-12)));
        assert_eq!(frame(b":+12\r\n").unwrap(), Some(Frame::Integer(12)));
        assert_eq!(frame(b":-9223372036854775808\r\n").unwrap(), Some(Frame::Integer(i64::MIN)));
        assert_eq!(frame(b"$-1\r\n").unwrap(), Some(Frame::Null));
        assert_eq!(frame(b"*-1\r\n").unwrap(), Some(Frame::Null));
        assert_eq!(frame(b"_\r\n").unwrap(), Some(Frame::Null));
        assert_eq!(frame(b"#t\r\n").unwrap(), Some(Frame::Boolean(true)));
        assert_eq!(frame(b"#f\r\n").unwrap(), Some(Frame::Boolean(false)));
        assert_eq!(frame(b"$4\r\na\r\nb\r\n").unwrap(), Some(Frame::bulk(&b"a\r\nb"[..])));
        assert_eq!(
            frame(b"*3\r\n:1\r\n*0\r\n$-1\r\n").unwrap(),
            Some(Frame::Array(vec![Frame::Integer(1), Frame::Array(vec![]), Frame::Null]))
        );
        assert_eq!(
            frame(b"%2\r\n+a\r\n:1\r\n+b\r\n%0\r\n").unwrap(),
            Some(Frame::Map(vec![(Frame::Simple("a".into()), Frame::Integer(1)), (Frame::Simple("b".into()), Frame::Map(vec![])),]))
        );
        // Other RESP3 types, mapped onto the existing variants.
        assert_eq!(frame(b",3.14\r\n").unwrap(), Some(Frame::Simple("3.14".into())));
        assert_eq!(frame(b"(12345678901234567890\r\n").unwrap(), Some(Frame::Simple("12345678901234567890".into())));
        assert_eq!(frame(b"=7\r\ntxt:abc\r\n").unwrap(), Some(Frame::bulk("abc")));
        assert_eq!(frame(b"!5\r\nERR x\r\n").unwrap(), Some(Frame::error("ERR x")));
        assert_eq!(frame(b"~2\r\n:1\r\n:2\r\n").unwrap(), Some(Frame::Array(vec![Frame::Integer(1), Frame::Integer(2)])));
        assert_eq!(
            frame(b">2\r\n+message\r\n:2\r\n").unwrap(),
            Some(Frame::Array(vec![Frame::Simple("message".into()), Frame::Integer(2)]))
        );
        // Attributes are skipped, at top level and inside aggregates.
        assert_eq!(frame(b"|1\r\n+ttl\r\n:3\r\n:7\r\n").unwrap(), Some(Frame::Integer(7)));
        assert_eq!(
            frame(b"*2\r\n|1\r\n+k\r\n*1\r\n:0\r\n:1\r\n|0\r\n:2\r\n").unwrap(),
            Some(Frame::Array(vec![Frame::Integer(1), Frame::Integer(2)]))
        );
    }

    #[test]
    fn malformed_replies() {
        let cases: &[(&[u8], ParseError)] = &[
            (b"$-5\r\n", protocol(MSG_BULK)),
            (b"$-5", protocol(MSG_BULK)),
            (b"$x\r\n", protocol(MSG_BULK)),
            (b"$3\r\nfooXX", protocol(MSG_CRLF)),
            (b"*x\r\n", protocol(MSG_MULTIBULK)),
            (b"*-2\r\n", protocol(MSG_MULTIBULK)),
            (b"%-1\r\n", protocol(MSG_MULTIBULK)),
            (b":abc\r\n", protocol(MSG_INTEGER)),
            (b":\r\n", protocol(MSG_INTEGER)),
            (b":-\r\n", protocol(MSG_INTEGER)),
            (b":9223372036854775808\r\n", protocol(MSG_INTEGER)),
            (b":-9223372036854775809\r\n", protocol(MSG_INTEGER)),
            (b"#x\r\n", protocol("invalid boolean")),
            (b"#tt", protocol("invalid boolean")),
            (b"_x", protocol("invalid null")),
            (b"+OK\rX", protocol("invalid line terminator")),
            (b"?\r\n", protocol("invalid frame type '?'")),
            (b"*1\r\n?", protocol("invalid frame type '?'")),
        ];
        for (input, err) in cases {
            assert_eq!(frame(input).unwrap_err(), *err, "input {:?}", String::from_utf8_lossy(input));
        }
        let limits = Limits { max_bulk_len: 3, max_array_len: 2, ..Limits::default() };
        let parse = |input: &[u8]| parse_frame(&mut BytesMut::from(input), &limits);
        assert_eq!(parse(b"$4\r\n").unwrap_err(), too_large(MSG_BULK));
        assert_eq!(parse(b"*3\r\n").unwrap_err(), too_large(MSG_MULTIBULK));
        assert_eq!(parse(b"%3\r\n").unwrap_err(), too_large(MSG_MULTIBULK));
        assert_eq!(parse(b"+OK").unwrap(), None);
        assert_eq!(parse(b"+OKK").unwrap(), None);
        assert_eq!(parse(b"+OKKK").unwrap_err(), too_large("line too long"));
    }

    #[test]
    fn nesting_depth_limited() {
        let mut deep = b"*1\r\n".repeat(MAX_NESTING_DEPTH);
        deep.extend_from_slice(b":1\r\n");
        assert!(frame(&deep).unwrap().is_some());
        let mut deeper = b"*1\r\n".repeat(MAX_NESTING_DEPTH + 1);
        deeper.extend_from_slice(b":1\r\n");
        assert_eq!(frame(&deeper).unwrap_err(), protocol("too deeply nested reply"));
    }

    fn sample_frames() -> Vec<Frame> {
        vec![
            Frame::ok(),
            Frame::error("ERR unknown command 'FOO'"),
            Frame::Integer(i64::MIN),
            Frame::Integer(123),
            Frame::bulk(&b"bin\r\n\0ary"[..]),
            Frame::bulk(""),
            Frame::Null,
            Frame::Boolean(true),
            Frame::Array(vec![]),
            Frame::Array(vec![
                Frame::bulk("a"),
                Frame::Array(vec![Frame::Integer(1), Frame::Null]),
                Frame::Map(vec![(Frame::bulk("k"), Frame::Boolean(false))]),
            ]),
            Frame::Map(vec![(Frame::Simple("x".into()), Frame::Array(vec![Frame::ok()])), (Frame::bulk("y"), Frame::Map(vec![]))]),
        ]
    }

    /// What a frame looks like after a RESP2 round trip.
    fn downgrade(f: &Frame) -> Frame {
        match f {
            Frame::Boolean(b) => Frame::Integer(*b as i64),
            Frame::Array(v) => Frame::Array(v.iter().map(downgrade).collect()),
            Frame::Map(m) => Frame::Array(m.iter().flat_map(|(k, v)| [downgrade(k), downgrade(v)]).collect()),
            other => other.clone(),
        }
    }

    #[test]
    fn round_trips() {
        for f in sample_frames() {
            let mut buf = BytesMut::from(&encoded(&f, Protocol::Resp3)[..]);
            assert_eq!(parse_frame(&mut buf, &lim()).unwrap(), Some(f.clone()));
            assert!(buf.is_empty());
            let mut buf = BytesMut::from(&encoded(&f, Protocol::Resp2)[..]);
            assert_eq!(parse_frame(&mut buf, &lim()).unwrap(), Some(downgrade(&f)));
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn frames_bytewise_equals_whole() {
        let frames = sample_frames();
        let mut wire = BytesMut::new();
        for f in &frames {
            f.encode(Protocol::Resp3, &mut wire);
        }
        let mut dec = FrameDecoder::new();
        for chunk in [1, 2, 3, 5, 8, 13, wire.len()] {
            for stateless in [true, false] {
                let mut buf = BytesMut::new();
                let mut got = Vec::new();
                for piece in wire.chunks(chunk) {
                    buf.extend_from_slice(piece);
                    loop {
                        let before = buf.clone();
                        let r = if stateless { parse_frame(&mut buf, &lim()).unwrap() } else { dec.decode(&mut buf, &lim()).unwrap() };
                        match r {
                            Some(f) => got.push(f),
                            None => {
                                assert_eq!(before, buf);
                                break;
                            }
                        }
                    }
                }
                assert_eq!(got, frames, "chunk {chunk}");
                assert!(buf.is_empty());
            }
        }
    }

    #[test]
    fn encode_helpers_match_frames() {
        let mut a = BytesMut::new();
        encode_map_len(1, Protocol::Resp3, &mut a);
        encode_simple("k", &mut a);
        encode_array_len(2, &mut a);
        encode_bulk(b"v", &mut a);
        encode_integer(-1, &mut a);
        encode_null(Protocol::Resp3, &mut a);
        encode_bool(true, Protocol::Resp3, &mut a);
        encode_error("ERR e", &mut a);
        let mut b = BytesMut::new();
        for f in [
            Frame::Map(vec![(Frame::Simple("k".into()), Frame::Array(vec![Frame::bulk("v"), Frame::Integer(-1)]))]),
            Frame::Null,
            Frame::Boolean(true),
            Frame::error("ERR e"),
        ] {
            f.encode(Protocol::Resp3, &mut b);
        }
        assert_eq!(a, b);
    }
}

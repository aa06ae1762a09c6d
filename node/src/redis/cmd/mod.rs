//! Redis commands, one file each: its wire format, what it replies and
//! what it says to bad input in the file's doc, then its parse and run
//! steps. Causeway's own `CW.*` commands are under `cw/`. `execute` checks
//! authentication and arity and hands the arguments to the command. Adding
//! a command is one file and one line in `COMMANDS`.
//!
//! A container (CLIENT, CONFIG, COMMAND) lists its subcommands, each with
//! its own arity, as Redis 7 does: `execute` answers an unknown one and
//! checks the arity of a known one before the container's handler runs, and
//! INFO commandstats counts each on its own row (`client|setname`).
//!
//! Data commands (`Handler::Queue`) do not wait for the replicas: their
//! `parse` turns the arguments into requests for the connection's session
//! and says how to answer from the responses, so a pipelined batch is
//! queued on the session at once (`conn.rs`), and parsing needs no socket
//! or node, only the clock (for expiries relative to now). Every other command (`Handler::Now`) runs once the commands
//! before it have been answered, so it sees the session as they left it
//! (CW.SESSION EXPORT, HELLO, ...).

mod auth;
mod client;
mod command;
mod config;
mod cw;
mod dbsize;
mod del;
mod echo;
mod exists;
mod expire;
mod flushall;
mod get;
mod getex;
mod hello;
mod incr;
mod info;
mod keys;
mod memory;
mod mget;
mod multi;
mod object;
mod ping;
mod quit;
mod select;
mod set;
mod setex;
mod strings;
mod time;
mod ttl;
mod wait;

use super::conn::{client_error, Answer, Batch, Conn, Dispatch, Outcome, Responses};
use super::server::Server;
use super::stats::{Call, Row};
use crate::runtime::Clock;
use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_core::error::Error;
use causeway_resp::Frame;
use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

impl Batch {
    fn new(requests: smallvec::SmallVec<[Request; 1]>, answer: fn(&Server, Responses) -> Frame) -> Result<Batch, Frame> {
        Ok(Batch { requests, level: None, answer: Answer::Plain(answer) })
    }

    /// A batch answered with two numbers from its arguments.
    fn with(
        requests: smallvec::SmallVec<[Request; 1]>,
        numbers: [i64; 2],
        answer: fn(&Server, Responses, [i64; 2]) -> Frame,
    ) -> Result<Batch, Frame> {
        Ok(Batch { requests, level: None, answer: Answer::With(answer, numbers) })
    }
}

type Now = for<'a> fn(&'a mut Conn, Vec<Bytes>) -> Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;

pub enum Handler {
    /// Runs once every earlier command of the connection is answered.
    Now(Now),
    /// A data command: its requests (or an error reply, for bad arguments).
    Queue(fn(&[Bytes], Clock) -> Result<Batch, Frame>),
}

/// A command: its name, arity as Redis states it (negative: at least that
/// many, counting the name), whether it may run before AUTH, its handler,
/// and, for a container, its subcommands.
pub struct Command {
    pub name: &'static str,
    pub arity: i64,
    pub before_auth: bool,
    pub handler: Handler,
    pub subcommands: &'static [Subcommand],
}

/// A container's subcommand (the second word, lowercase) and its arity,
/// counting the container's name.
pub struct Subcommand {
    pub name: &'static str,
    pub arity: i64,
}

macro_rules! command {
    ($name:literal, $arity:expr, $before_auth:expr, $f:path) => {
        command!($name, $arity, $before_auth, $f, &[])
    };
    ($name:literal, $arity:expr, $before_auth:expr, $f:path, $subcommands:expr) => {
        Command {
            name: $name,
            arity: $arity,
            before_auth: $before_auth,
            handler: Handler::Now(|c, a| Box::pin($f(c, a))),
            subcommands: $subcommands,
        }
    };
}

macro_rules! data {
    ($name:literal, $arity:expr, $f:path) => {
        Command { name: $name, arity: $arity, before_auth: false, handler: Handler::Queue($f), subcommands: &[] }
    };
}

/// Every command this node understands.
pub static COMMANDS: &[Command] = &[
    data!("get", 2, get::parse),
    data!("set", -3, set::parse),
    data!("del", -2, del::parse),
    data!("unlink", -2, del::parse),
    data!("getdel", 2, strings::getdel),
    data!("getset", 3, strings::getset),
    data!("setnx", 3, strings::setnx),
    data!("append", 3, strings::append),
    data!("setrange", 4, strings::setrange),
    data!("getrange", 4, strings::getrange),
    data!("substr", 4, strings::getrange),
    data!("incrbyfloat", 3, strings::incrbyfloat),
    data!("strlen", 2, strings::strlen),
    data!("type", 2, strings::type_of),
    data!("mset", -3, strings::mset),
    data!("incr", 2, incr::parse),
    data!("decr", 2, incr::parse),
    data!("incrby", 3, incr::parse),
    data!("decrby", 3, incr::parse),
    data!("exists", -2, exists::parse),
    data!("touch", -2, exists::parse),
    data!("mget", -2, mget::parse),
    data!("setex", 4, setex::parse),
    data!("psetex", 4, setex::parse),
    data!("getex", -2, getex::parse),
    data!("expire", -3, expire::parse),
    data!("pexpire", -3, expire::parse),
    data!("expireat", -3, expire::parse),
    data!("pexpireat", -3, expire::parse),
    data!("persist", 2, expire::persist),
    data!("ttl", 2, ttl::parse),
    data!("pttl", 2, ttl::parse),
    data!("expiretime", 2, ttl::parse),
    data!("pexpiretime", 2, ttl::parse),
    data!("dbsize", 1, dbsize::parse),
    data!("keys", 2, keys::keys),
    data!("scan", -2, keys::scan),
    data!("randomkey", 1, keys::randomkey),
    data!("flushall", -1, flushall::parse),
    data!("flushdb", -1, flushall::parse),
    command!("ping", -1, false, ping::run),
    command!("echo", 2, false, echo::run),
    command!("time", 1, false, time::run),
    command!("wait", 3, false, wait::run),
    command!("hello", -1, true, hello::run),
    command!("auth", -2, true, auth::run),
    command!("select", 2, false, select::run),
    command!("info", -1, false, info::run),
    command!("command", -1, false, command::run, command::SUBCOMMANDS),
    command!("client", -2, false, client::run, client::SUBCOMMANDS),
    command!("config", -2, false, config::run, config::SUBCOMMANDS),
    command!("memory", -2, false, memory::run, memory::SUBCOMMANDS),
    command!("object", -2, false, object::run, object::SUBCOMMANDS),
    command!("quit", -1, true, quit::run),
    command!("multi", 1, false, multi::multi),
    command!("exec", 1, false, multi::exec),
    command!("discard", 1, false, multi::discard),
    command!("watch", -2, false, multi::watch),
    data!("unwatch", 1, multi::unwatch),
    command!("cw.consistency", -1, false, cw::consistency::run),
    data!("cw.with", -3, cw::with::parse),
    command!("cw.keyrange", 1, false, cw::keyrange::run),
    command!("cw.chain", 2, false, cw::chain::run),
    command!("cw.session", -2, false, cw::session::run),
    command!("cw.status", 1, false, cw::status::run),
    command!("cw.digest", 1, false, cw::digest::run),
    command!("cw.cluster", -2, false, cw::cluster::run),
    command!("cw.sites", 1, false, cw::sites::run),
    command!("cw.wan", -3, false, cw::sites::wan),
    command!("cw.clock", 3, false, cw::sites::clock),
    command!("cw.wait", -3, false, cw::sites::wait),
    command!("cw.conflicts", -1, false, cw::sites::conflicts),
    command!("cw.dr", -2, false, cw::dr::run),
];

/// A command's index in `COMMANDS`.
fn position(name: &[u8]) -> Option<usize> {
    COMMANDS.iter().position(|c| c.name.as_bytes().eq_ignore_ascii_case(name))
}

fn lookup(name: &[u8]) -> Option<&'static Command> {
    position(name).map(|i| &COMMANDS[i])
}

/// The command table, as connections run it (`conn::serve`).
pub struct Commands;

impl Dispatch for Commands {
    fn execute(conn: &mut Conn, args: Vec<Bytes>) -> impl Future<Output = (Call, Outcome)> + Send {
        execute(conn, args)
    }
}

/// Runs one command: a data command is only parsed into its requests.
/// Also says what its reply counts toward in INFO (`stats::Call`): the
/// checks before it runs are Redis 7's (`processCommand`), and their errors
/// are rejections.
pub async fn execute(conn: &mut Conn, args: Vec<Bytes>) -> (Call, Outcome) {
    let (call, outcome) = check_and_run(conn, args).await;
    if matches!(call, Call::Unknown | Call::Rejected(_)) {
        // Refused outright while queueing: EXEC will run nothing.
        if let Some(multi) = conn.multi.as_mut() {
            multi.failed = true;
        }
    }
    (call, outcome)
}

async fn check_and_run(conn: &mut Conn, args: Vec<Bytes>) -> (Call, Outcome) {
    let Some(i) = position(&args[0]) else {
        return (Call::Unknown, unknown(&args).into());
    };
    let cmd = &COMMANDS[i];
    let (row, sub) = match (cmd.subcommands, args.get(1)) {
        ([], _) | (_, None) => (Row(i), None),
        (subcommands, Some(word)) => match subcommands.iter().position(|s| s.name.as_bytes().eq_ignore_ascii_case(word)) {
            Some(j) => (subcommand_row(i, j), Some(&subcommands[j])),
            None => return (Call::Unknown, unknown_subcommand(cmd, word).into()),
        },
    };
    if !conn.authed && !cmd.before_auth {
        return (Call::Rejected(row), Frame::error("NOAUTH Authentication required.").into());
    }
    if !arity_ok(sub.map_or(cmd.arity, |s| s.arity), &args) {
        let name = sub.map_or_else(|| cmd.name.to_string(), |s| format!("{}|{}", cmd.name, s.name));
        if cmd.name == "exec" && conn.multi.take().is_some() {
            // As Redis: the transaction ends, discarded.
            let why = format!("EXECABORT Transaction discarded because of: wrong number of arguments for '{name}' command");
            return (Call::Rejected(row), Frame::error(why).into());
        }
        return (Call::Rejected(row), wrong_arity(&name).into());
    }
    let call = Call::Ran(row, Instant::now());
    let clock = conn.server.clock;
    if let Some(multi) = conn.multi.as_mut().filter(|_| !matches!(cmd.name, "multi" | "exec" | "discard" | "watch" | "quit")) {
        return match cmd.handler {
            Handler::Queue(parse) if cmd.name != "cw.with" => {
                multi.queued.push(parse(&args, clock));
                (call, Frame::Simple("QUEUED".into()).into())
            }
            _ => (
                Call::Rejected(row),
                Frame::error(format!("ERR {} inside MULTI is not supported: only data commands are", cmd.name)).into(),
            ),
        };
    }
    let outcome = match cmd.handler {
        Handler::Queue(parse) => match parse(&args, conn.server.clock) {
            Ok(batch) => Outcome::Queue(batch),
            Err(e) => e.into(),
        },
        Handler::Now(run) => {
            conn.settle().await;
            run(conn, args).await
        }
    };
    (call, outcome)
}

fn check_arity(cmd: &Command, args: &[Bytes]) -> Result<(), Frame> {
    if !arity_ok(cmd.arity, args) {
        return Err(wrong_arity(cmd.name));
    }
    Ok(())
}

fn arity_ok(arity: i64, args: &[Bytes]) -> bool {
    let n = args.len() as i64;
    if arity < 0 {
        n >= -arity
    } else {
        n == arity
    }
}

/// How many rows the table of command stats has: one per command, then one
/// per subcommand, container by container.
pub fn row_count() -> usize {
    COMMANDS.len() + COMMANDS.iter().map(|c| c.subcommands.len()).sum::<usize>()
}

/// The row of subcommand `j` of command `i`.
fn subcommand_row(i: usize, j: usize) -> Row {
    Row(COMMANDS.len() + COMMANDS[..i].iter().map(|c| c.subcommands.len()).sum::<usize>() + j)
}

/// Every row of the table of command stats with the name Redis 7 gives it
/// (`get`, `client`, `client|setname`), in the order INFO prints them:
/// each command, then its subcommands.
pub fn rows() -> impl Iterator<Item = (Row, String)> {
    COMMANDS.iter().enumerate().flat_map(|(i, c)| {
        std::iter::once((Row(i), c.name.to_string()))
            .chain(c.subcommands.iter().enumerate().map(move |(j, s)| (subcommand_row(i, j), format!("{}|{}", c.name, s.name))))
    })
}

/// A container's word that is none of its subcommands. Redis adds "Try
/// CLIENT HELP.", which Causeway has no HELP for.
fn unknown_subcommand(cmd: &Command, word: &[u8]) -> Frame {
    Frame::error(format!("ERR unknown subcommand '{}' for '{}'", String::from_utf8_lossy(word), cmd.name))
}

/// As Redis words it: each argument quoted and followed by a space.
fn unknown(args: &[Bytes]) -> Frame {
    let shown: String = args[1..].iter().take(8).map(|a| format!("'{}' ", String::from_utf8_lossy(a))).collect();
    Frame::error(format!("ERR unknown command '{}', with args beginning with: {shown}", String::from_utf8_lossy(&args[0])))
}

pub fn wrong_arity(name: &str) -> Frame {
    Frame::error(format!("ERR wrong number of arguments for '{name}' command"))
}

pub fn syntax_error() -> Frame {
    Frame::error("ERR syntax error")
}

/// An argument as text, for option names.
fn upper(arg: &[u8]) -> String {
    String::from_utf8_lossy(arg).to_ascii_uppercase()
}

/// An integer argument, or Redis's error for one that is not.
fn integer(arg: &[u8]) -> Result<i64, Frame> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| Frame::error("ERR value is not an integer or out of range"))
}

/// An expiry option of SET, SETEX, PSETEX or GETEX (`unit`: EX, PX, EXAT or
/// PXAT) and its number, as Redis 7 checks it: positive, and its instant
/// within range; else `ERR invalid expire time in '<command>' command`.
fn expiry_in(unit: &str, arg: &[u8], command: &str, clock: Clock) -> Result<causeway_core::message::Expiry, Frame> {
    use causeway_core::message::Expiry;
    let n = integer(arg)?;
    let invalid = || Frame::error(format!("ERR invalid expire time in '{command}' command"));
    let ms = match unit {
        "EX" | "EXAT" => n.checked_mul(1000),
        _ => Some(n),
    }
    .filter(|&ms| ms > 0)
    .ok_or_else(invalid)?;
    match unit {
        "EX" | "PX" => {
            (ms as u64).checked_add(clock.now_ms()).filter(|&at| at <= i64::MAX as u64).ok_or_else(invalid)?;
            Ok(Expiry::After(ms as u64))
        }
        _ => Ok(Expiry::At(ms as u64)),
    }
}

/// Keys and values are kept in their own allocation: arguments are slices
/// of the connection's read buffer, and keeping one would keep the buffer.
fn own(b: &Bytes) -> Bytes {
    Bytes::copy_from_slice(b)
}

/// A key and its value, copied into one buffer of their own: one
/// allocation, shared by the two (cloning either allocates nothing more).
fn own_both(key: &Bytes, value: &Bytes) -> (Bytes, Bytes) {
    let mut buf = bytes::BytesMut::with_capacity(key.len() + value.len());
    buf.extend_from_slice(key);
    buf.extend_from_slice(value);
    let both = buf.freeze();
    (both.slice(..key.len()), both.slice(key.len()..))
}

/// The one response of a single-request data command.
fn only(mut responses: Responses) -> Result<Response, Error> {
    responses.next().expect("one request, one response")
}

/// How many responses `hit`, or the first error (DEL, EXISTS).
fn count(responses: Responses, hit: fn(&Response) -> bool) -> Frame {
    let mut n = 0;
    for response in responses {
        match response {
            Ok(r) if hit(&r) => n += 1,
            Ok(_) => {}
            Err(e) => return client_error(e),
        }
    }
    Frame::Integer(n)
}

/// Words as a command's arguments, for tests.
#[cfg(test)]
fn args(words: &[&str]) -> Vec<Bytes> {
    words.iter().map(|w| Bytes::copy_from_slice(w.as_bytes())).collect()
}

/// The requests of a data command's batch (see `queue`), for tests.
#[cfg(test)]
fn requests(words: &[&str]) -> Result<Vec<Request>, Frame> {
    queue(words).map(|batch| batch.requests.into_vec())
}

/// A data command's parse step as `execute` runs it (arity first), without
/// a connection or node: its batch, or the error it replies. For tests.
#[cfg(test)]
fn queue(words: &[&str]) -> Result<Batch, Frame> {
    let args = args(words);
    let cmd = lookup(&args[0]).expect("a known command");
    let Handler::Queue(parse) = cmd.handler else { panic!("{} is not a data command", cmd.name) };
    check_arity(cmd, &args)?;
    parse(&args, Clock::for_tests())
}

#[cfg(test)]
mod tests {
    use super::{row_count, rows, Row};
    use std::collections::HashSet;

    #[test]
    fn every_command_and_subcommand_has_its_own_row_named_as_redis_names_it() {
        let rows: Vec<(Row, String)> = rows().collect();
        assert_eq!(rows.len(), row_count());
        assert_eq!(rows.iter().map(|(r, _)| r.0).collect::<HashSet<_>>(), (0..row_count()).collect());
        let names: Vec<&str> = rows.iter().map(|(_, n)| n.as_str()).collect();
        for name in ["get", "client", "client|setname", "config|get", "command|count", "cw.keyrange"] {
            assert!(names.contains(&name), "{name} in {names:?}");
        }
        let client = names.iter().position(|n| *n == "client").unwrap();
        assert!(names[client + 1].starts_with("client|"), "a container's subcommands follow it: {names:?}");
    }
}

//! Redis commands. `execute` checks authentication and arity and hands the
//! arguments to the command's function: data commands in `keys`,
//! connection and server commands in `server`, Causeway's own `CW.*`
//! commands in `causeway`. Adding a command is one function and one line in
//! `COMMANDS`.

mod causeway;
mod keys;
mod server;

use crate::conn::Conn;
use bytes::Bytes;
use causeway_resp::Frame;
use std::future::Future;
use std::pin::Pin;

/// What the connection does after a command.
pub enum Outcome {
    Reply(Frame),
    /// Send this, then close the connection (QUIT).
    Close(Frame),
}

impl From<Frame> for Outcome {
    fn from(f: Frame) -> Self {
        Outcome::Reply(f)
    }
}

type Handler = for<'a> fn(&'a mut Conn, Vec<Bytes>) -> Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;

/// A command: its name, arity as Redis states it (negative: at least that
/// many, counting the name), whether it may run before AUTH, and its handler.
pub struct Command {
    pub name: &'static str,
    pub arity: i64,
    pub before_auth: bool,
    pub handler: Handler,
}

macro_rules! command {
    ($name:literal, $arity:expr, $before_auth:expr, $f:path) => {
        Command { name: $name, arity: $arity, before_auth: $before_auth, handler: |c, a| Box::pin($f(c, a)) }
    };
}

/// Every command this node understands.
pub static COMMANDS: &[Command] = &[
    command!("get", 2, false, keys::get),
    command!("set", -3, false, keys::set),
    command!("del", -2, false, keys::del),
    command!("exists", -2, false, keys::exists),
    command!("mget", -2, false, keys::mget),
    command!("dbsize", 1, false, keys::dbsize),
    command!("flushall", -1, false, keys::flushall),
    command!("flushdb", -1, false, keys::flushall),
    command!("ping", -1, false, server::ping),
    command!("echo", 2, false, server::echo),
    command!("hello", -1, true, server::hello),
    command!("auth", -2, true, server::auth),
    command!("select", 2, false, server::select),
    command!("info", -1, false, server::info),
    command!("command", -1, false, server::command),
    command!("client", -2, false, server::client),
    command!("config", -2, false, server::config),
    command!("quit", -1, true, server::quit),
    command!("cw.consistency", -1, false, causeway::consistency),
    command!("cw.with", -3, false, causeway::with),
    command!("cw.keyrange", 1, false, causeway::keyrange),
    command!("cw.chain", 2, false, causeway::chain),
    command!("cw.session", -2, false, causeway::session),
    command!("cw.status", 1, false, causeway::status),
    command!("cw.digest", 1, false, causeway::digest),
    command!("cw.cluster", -2, false, causeway::cluster),
];

fn lookup(name: &[u8]) -> Option<&'static Command> {
    COMMANDS.iter().find(|c| c.name.as_bytes().eq_ignore_ascii_case(name))
}

/// Runs one command.
pub async fn execute(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let Some(cmd) = lookup(&args[0]) else {
        return unknown(&args).into();
    };
    if !conn.authed && !cmd.before_auth {
        return Frame::error("NOAUTH Authentication required.").into();
    }
    let n = args.len() as i64;
    if (cmd.arity > 0 && n != cmd.arity) || (cmd.arity < 0 && n < -cmd.arity) {
        return wrong_arity(cmd.name).into();
    }
    (cmd.handler)(conn, args).await
}

fn unknown(args: &[Bytes]) -> Frame {
    let shown: Vec<String> = args[1..].iter().take(8).map(|a| format!("'{}'", String::from_utf8_lossy(a))).collect();
    Frame::error(format!("ERR unknown command '{}', with args beginning with: {}", String::from_utf8_lossy(&args[0]), shown.join(" ")))
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

//! `causeway cli`: an interactive client on the native library, with the p2p
//! store's commands: get, put, delete, connect, disconnect, keyrange,
//! status, help, quit. Reads commands from stdin, so it also works in
//! scripts: `echo "put a 1" | causeway cli`.

use crate::resp_client::password;
use causeway_client::Client;
use clap::Args;
use std::io::{BufRead, Write};

#[derive(Args)]
pub struct CliArgs {
    /// A node of the site to connect to.
    #[arg(long, default_value = "127.0.0.1:6380")]
    addr: String,
}

const HELP: &str = "\
commands:
  get <key>              read a key
  put <key> <value...>   write a key (the rest of the line is the value)
  delete <key>           delete a key
  mget <key> <key...>    read several keys as one consistent snapshot
  connect <host:port>    connect to a site through one of its nodes
  disconnect             close the connection
  keyrange               partitions and their chains (head first)
  status                 the site: nodes, shape, epoch
  consistency [level]    show or set: causal (default), eventual, linearizable
  help                   this text
  quit                   leave";

pub fn run(args: CliArgs) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let mut client = match Client::connect_with_password(&args.addr, password().as_deref()).await {
            Ok(c) => {
                println!("connected to {} ({} nodes); type 'help' for commands", args.addr, c.topology().nodes.len());
                Some(c)
            }
            Err(e) => {
                let hint = if e.to_string().contains("NOAUTH") { " (the password goes in $CAUSEWAY_PASSWORD)" } else { "" };
                println!("not connected: {e}{hint}; use 'connect <host:port>'");
                None
            }
        };
        let stdin = std::io::stdin();
        let mut line = String::new();
        loop {
            print!("causeway> ");
            let _ = std::io::stdout().flush();
            line.clear();
            if stdin.lock().read_line(&mut line).map_err(|e| e.to_string())? == 0 {
                return Ok(());
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            let Some(&cmd) = words.first() else { continue };
            if cmd == "quit" || cmd == "exit" {
                return Ok(());
            }
            println!("{}", execute(&mut client, cmd, &words[1..], &line).await);
        }
    })
}

async fn execute(client: &mut Option<Client>, cmd: &str, args: &[&str], line: &str) -> String {
    let cmd = cmd.to_ascii_lowercase();
    let cmd = cmd.as_str();
    match (cmd, args.len()) {
        ("help", _) => return HELP.into(),
        ("connect", 1) => {
            return match Client::connect_with_password(args[0], password().as_deref()).await {
                Ok(c) => {
                    let n = c.topology().nodes.len();
                    *client = Some(c);
                    format!("connected to {} ({n} nodes)", args[0])
                }
                Err(e) => format!("error: {e}"),
            }
        }
        ("disconnect", 0) => {
            return match client.take() {
                Some(_) => "disconnected".into(),
                None => "not connected".into(),
            }
        }
        _ => {}
    }
    let Some(c) = client.as_mut() else { return "error: not connected; use 'connect <host:port>'".into() };
    let shown = |v: Option<bytes::Bytes>| v.map_or("(nil)".to_string(), |b| format!("\"{}\"", String::from_utf8_lossy(&b)));
    match (cmd, args.len()) {
        ("get", 1) => match c.get_at(args[0].as_bytes()).await {
            Ok((v, at)) => format!("{} (served by chain position {at})", shown(v)),
            Err(e) => format!("error: {e}"),
        },
        ("put", n) if n >= 2 => {
            // The value is the rest of the line after the key, spaces kept.
            let rest = line.trim_start()[3..].trim_start();
            let value = rest[args[0].len()..].trim();
            match c.put(args[0].as_bytes(), value.as_bytes()).await {
                Ok(()) => "OK".into(),
                Err(e) => format!("error: {e}"),
            }
        }
        ("delete", 1) => match c.delete(args[0].as_bytes()).await {
            Ok(true) => "deleted".into(),
            Ok(false) => "no such key".into(),
            Err(e) => format!("error: {e}"),
        },
        ("mget", n) if n >= 1 => {
            let keys: Vec<&[u8]> = args.iter().map(|k| k.as_bytes()).collect();
            match c.get_transaction(&keys).await {
                Ok(values) => args.iter().zip(values).map(|(k, v)| format!("{k} = {}", shown(v))).collect::<Vec<_>>().join("\n"),
                Err(e) => format!("error: {e}"),
            }
        }
        ("keyrange", 0) => match c.refresh_topology().await {
            Ok(t) => {
                let name = |id: u16| t.node(id).map_or(format!("node {id}"), |n| format!("{id}@{}", n.addr));
                let mut s = format!("epoch {}; {} partitions (head -> tail):", t.epoch, t.chains.len());
                for (p, chain) in t.chains.iter().enumerate() {
                    s.push_str(&format!("\n  {p:>4}: {}", chain.nodes.iter().map(|&n| name(n)).collect::<Vec<_>>().join(" -> ")));
                }
                s
            }
            Err(e) => format!("error: {e}"),
        },
        ("status", 0) => match (c.refresh_topology().await, c.count().await) {
            (Ok(t), Ok(keys)) => {
                let mut s = format!(
                    "epoch {}: {} nodes, {} partitions, R={}, k={}, {keys} keys",
                    t.epoch,
                    t.nodes.len(),
                    t.shape.partitions,
                    t.shape.replicas,
                    t.shape.k
                );
                for n in &t.nodes {
                    let roles = t.roles(n.id);
                    s.push_str(&format!(
                        "\n  node {} {}: head of {}, middle of {}, tail of {}",
                        n.id, n.addr, roles.head, roles.middle, roles.tail
                    ));
                }
                s
            }
            (Err(e), _) | (_, Err(e)) => format!("error: {e}"),
        },
        ("consistency", 0) => format!("{}", c.consistency()),
        ("consistency", 1) => match args[0].parse() {
            Ok(level) => {
                c.set_consistency(level);
                "OK".into()
            }
            Err(e) => format!("error: {e}"),
        },
        ("get" | "put" | "delete" | "mget" | "connect" | "keyrange" | "status" | "consistency" | "disconnect", _) => {
            format!("error: wrong arguments for '{cmd}'; type 'help'")
        }
        _ => format!("error: unknown command '{cmd}'; type 'help'"),
    }
}

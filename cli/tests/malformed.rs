//! Hostile and broken clients: malformed RESP, oversized headers, clients
//! that vanish mid-request or never read. None of them may disturb the
//! node or its other connections.

mod common;

use causeway_resp::Frame;
use common::{bulk, simple, Cluster, Opts, Raw, CLUSTER_SECRET};
use redis::cmd;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

/// The node still serves a fresh connection and an existing one.
fn assert_serving(c: &Cluster, i: usize, existing: &mut redis::Connection) {
    assert_eq!(cmd("PING").query::<String>(existing).unwrap(), "PONG");
    let mut fresh = c.conn(i);
    cmd("SET").arg("alive").arg(i).query::<()>(&mut fresh).unwrap();
    assert_eq!(cmd("GET").arg("alive").query::<usize>(&mut fresh).unwrap(), i);
}

#[test]
fn huge_bulk_header_is_a_protocol_error_and_closes() {
    let c = Cluster::three();
    let mut bystander = c.conn(0);
    cmd("SET").arg("k").arg("before").query::<()>(&mut bystander).unwrap();
    let mut raw = c.raw(0);
    // Only the header: the node must not wait for 999999999999 bytes.
    raw.send(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$999999999999\r\n");
    assert_eq!(raw.read_to_close(), b"-ERR Protocol error: invalid bulk length\r\n");
    // Also when the digits arrive one at a time (rejected as soon as they
    // exceed the limit, before the CRLF).
    let mut raw = c.raw(0);
    raw.send(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$");
    for _ in 0..12 {
        // The node may close as soon as the length is too long: later
        // digits can then fail to send, which is fine.
        let _ = std::io::Write::write_all(&mut raw.stream, b"9");
    }
    assert_eq!(raw.read_to_close(), b"-ERR Protocol error: invalid bulk length\r\n");
    // A huge argument count likewise.
    let mut raw = c.raw(1);
    raw.send(b"*99999999999\r\n");
    assert_eq!(raw.read_to_close(), b"-ERR Protocol error: invalid multibulk length\r\n");
    assert_eq!(cmd("GET").arg("k").query::<String>(&mut bystander).unwrap(), "before");
    assert_serving(&c, 0, &mut bystander);
}

#[test]
fn max_value_bytes_is_enforced_before_the_body() {
    let c = Cluster::start_with(Opts::new(3, 3, 2).flag("--max-value-bytes", 1024));
    let mut con = c.conn(1);
    // At the limit: fine.
    let max = vec![b'x'; 1024];
    cmd("SET").arg("k").arg(&max).query::<()>(&mut con).unwrap();
    assert_eq!(cmd("GET").arg("k").query::<Vec<u8>>(&mut con).unwrap(), max);
    // One over: refused from the header alone, and the connection closed.
    let mut raw = c.raw(1);
    raw.send(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1025\r\n");
    assert_eq!(raw.read_to_close(), b"-ERR Protocol error: invalid bulk length\r\n");
    // Keys are bulk strings too.
    let mut raw = c.raw(2);
    raw.send(b"*2\r\n$3\r\nGET\r\n$2000\r\n");
    assert_eq!(raw.read_to_close(), b"-ERR Protocol error: invalid bulk length\r\n");
    // Through the redis crate: the command fails, the value is unchanged.
    let mut victim = c.conn(1);
    assert!(cmd("SET").arg("k").arg(vec![b'y'; 5000]).query::<()>(&mut victim).is_err());
    assert_eq!(cmd("GET").arg("k").query::<Vec<u8>>(&mut con).unwrap(), max);
    assert_serving(&c, 1, &mut con);
}

#[test]
fn max_args_is_enforced() {
    let c = Cluster::start_with(Opts::new(3, 3, 2).flag("--max-args", 4));
    let mut con = c.conn(0);
    assert_eq!(cmd("MGET").arg("a").arg("b").arg("c").query::<Vec<Option<String>>>(&mut con).unwrap(), vec![None, None, None]);
    let mut raw = c.raw(0);
    raw.send(b"*5\r\n");
    assert_eq!(raw.read_to_close(), b"-ERR Protocol error: invalid multibulk length\r\n");
    assert_serving(&c, 0, &mut con);
}

#[test]
fn garbage_is_answered_with_protocol_errors() {
    let c = Cluster::three();
    let mut bystander = c.conn(2);
    let cases: &[(&[u8], &[u8])] = &[
        (b"*abc\r\n", b"-ERR Protocol error: invalid multibulk length\r\n"),
        (b"*1\r\n:1\r\n", b"-ERR Protocol error: expected '$', got ':'\r\n"),
        (b"*2\r\n$3\r\nGET\r\n$-1\r\n", b"-ERR Protocol error: invalid bulk length\r\n"),
        (b"*1\r\n$4\r\nPINGxx\r\n", b"-ERR Protocol error: expected CRLF after bulk data\r\n"),
        (b"*1\r\n$x\r\n", b"-ERR Protocol error: invalid bulk length\r\n"),
        (b"ECHO \"unbalanced\r\n", b"-ERR Protocol error: unbalanced quotes in request\r\n"),
        // Replies to complete requests before the garbage are still sent.
        (b"PING\r\n*1\r\n$4\r\nPING\r\n*abc\r\n", b"+PONG\r\n+PONG\r\n-ERR Protocol error: invalid multibulk length\r\n"),
    ];
    for (input, expected) in cases {
        let mut raw = c.raw(2);
        raw.send(input);
        assert_eq!(
            String::from_utf8_lossy(&raw.read_to_close()),
            String::from_utf8_lossy(expected),
            "input {:?}",
            String::from_utf8_lossy(input)
        );
    }
    // An inline line longer than 64 KiB without a newline.
    let mut raw = c.raw(2);
    raw.send(&vec![b'a'; 70 * 1024]);
    assert_eq!(raw.read_to_close(), b"-ERR Protocol error: too big inline request\r\n");
    // Binary junk on one line is an (unknown) inline command, not a crash;
    // the connection stays open.
    let mut raw = c.raw(2);
    raw.send(b"\x00\x01\xff\xfejunk\r\n");
    assert!(matches!(raw.read_frame(), Frame::Error(e) if e.starts_with("ERR unknown command")));
    assert_eq!(raw.cmd(&[b"PING"]), simple("PONG"));
    // Random bytes, many times.
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    for _ in 0..20 {
        let mut junk = Vec::new();
        for _ in 0..200 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            junk.push(seed as u8);
        }
        let mut s = TcpStream::connect(c.addr(2)).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let _ = s.write_all(&junk);
        let mut sink = [0u8; 4096];
        let _ = s.read(&mut sink);
    }
    assert_serving(&c, 2, &mut bystander);
}

#[test]
fn inline_commands_work() {
    let c = Cluster::three();
    let mut raw = c.raw(1);
    raw.send(b"PING\r\n");
    assert_eq!(raw.read_exact_raw(7), b"+PONG\r\n");
    // Blank lines are skipped, a bare \n ends a line, quoting like redis-cli.
    raw.send(b"\r\n\n  \r\nSET greeting 'hello world'\nGET greeting\r\n");
    assert_eq!(raw.read_frame(), simple("OK"));
    assert_eq!(raw.read_frame(), bulk(b"hello world"));
    raw.send(b"SET esc \"a\\x00b\\r\\n\"\r\nGET esc\r\nPING \"two words\"\r\n");
    assert_eq!(raw.read_frame(), simple("OK"));
    assert_eq!(raw.read_frame(), bulk(b"a\x00b\r\n"));
    assert_eq!(raw.read_frame(), bulk(b"two words"));
    // Inline and multibulk mix on one connection; *0, *-1 and any negative
    // length (*-10) are ignored, as Redis does.
    raw.send(b"*0\r\n*-1\r\n*-10\r\nECHO x\r\n*1\r\n$4\r\nPING\r\n");
    assert_eq!(raw.read_frame(), bulk(b"x"));
    assert_eq!(raw.read_frame(), simple("PONG"));
    // A request split across many writes.
    for b in b"*2\r\n$3\r\nGET\r\n$8\r\ngreeting\r\n" {
        raw.send(&[*b]);
    }
    assert_eq!(raw.read_frame(), bulk(b"hello world"));
}

#[test]
fn client_vanishing_mid_command_does_not_affect_others() {
    let c = Cluster::three();
    let mut other = c.conn(0);
    cmd("SET").arg("k").arg("original").query::<()>(&mut other).unwrap();
    let halves: &[&[u8]] =
        &[b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhel", b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n", b"*3\r\n$3\r\nSE", b"*3", b"SET k half"];
    for half in halves {
        for how in 0..2 {
            let mut s = TcpStream::connect(c.addr(0)).unwrap();
            s.write_all(half).unwrap();
            if how == 0 {
                drop(s);
            } else {
                // Half-close: the node sees EOF mid-request.
                s.shutdown(Shutdown::Write).unwrap();
                s.set_read_timeout(Some(common::IO_TIMEOUT)).unwrap();
                let mut rest = Vec::new();
                let _ = s.read_to_end(&mut rest);
                assert!(rest.is_empty(), "answered an incomplete request: {:?}", String::from_utf8_lossy(&rest));
            }
            assert_eq!(cmd("GET").arg("k").query::<String>(&mut other).unwrap(), "original");
        }
    }
    // A client that disconnects while its command is in flight.
    for i in 0..20 {
        let mut s = TcpStream::connect(c.addr(i % 3)).unwrap();
        let mut out = bytes::BytesMut::new();
        causeway_resp::encode_request(&[b"SET", format!("gone{i}").as_bytes(), b"v"], &mut out);
        causeway_resp::encode_request(&[b"MGET", b"k", b"gone0"], &mut out);
        s.write_all(&out).unwrap();
        drop(s);
    }
    assert_eq!(cmd("GET").arg("k").query::<String>(&mut other).unwrap(), "original");
    let mut fresh = c.conn(1);
    cmd("SET").arg("k2").arg("v2").query::<()>(&mut fresh).unwrap();
    assert_eq!(cmd("GET").arg("k2").query::<String>(&mut fresh).unwrap(), "v2");
    assert_serving(&c, 0, &mut other);
    // Every abandoned connection was cleaned up: only `other` is left.
    common::eventually(Duration::from_secs(10), "connected_clients to drop back to 1", || {
        let info: String = cmd("INFO").query(&mut other).unwrap();
        info.contains("connected_clients:1\r\n").then_some(())
    });
}

#[test]
fn requests_before_a_half_close_are_answered() {
    // Like `printf 'SET k v\r\nGET k\r\n' | nc`: the client sends, shuts
    // down its side, and still gets every reply before the close.
    let c = Cluster::three();
    let mut s = TcpStream::connect(c.addr(1)).unwrap();
    s.set_read_timeout(Some(common::IO_TIMEOUT)).unwrap();
    s.write_all(b"SET half closed\r\nGET half\r\n*1\r\n$4\r\nPING\r\n").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    assert_eq!(String::from_utf8_lossy(&all), "+OK\r\n$6\r\nclosed\r\n+PONG\r\n");
}

#[test]
fn slow_reader_does_not_block_other_connections() {
    let c = Cluster::three();
    let value = vec![b'v'; 256 * 1024];
    let mut setup = c.conn(0);
    cmd("SET").arg("big").arg(&value).query::<()>(&mut setup).unwrap();
    // Pipeline many GETs of the big value (25 MB of replies) and read none.
    let mut slow = Raw::connect(&c.addr(0));
    let gets = 100;
    let mut out = bytes::BytesMut::new();
    for _ in 0..gets {
        causeway_resp::encode_request(&[b"GET", b"big"], &mut out);
    }
    slow.send(&out);
    // Meanwhile other connections to the same node work normally.
    std::thread::sleep(Duration::from_millis(100));
    let mut fast = c.conn(0);
    for i in 0..50 {
        cmd("SET").arg(format!("fast{i}")).arg(i).query::<()>(&mut fast).unwrap();
        assert_eq!(cmd("GET").arg(format!("fast{i}")).query::<i64>(&mut fast).unwrap(), i);
    }
    assert_eq!(cmd("GET").arg("big").query::<Vec<u8>>(&mut setup).unwrap().len(), value.len());
    // The slow reader eventually gets every reply, intact and in order.
    for i in 0..gets {
        match slow.read_frame() {
            Frame::Bulk(b) => assert!(b.len() == value.len() && b.iter().all(|&x| x == b'v'), "reply {i} corrupted"),
            other => panic!("reply {i}: {other:?}"),
        }
    }
    assert_eq!(slow.cmd(&[b"PING"]), simple("PONG"));
}

#[test]
fn pipelined_raw_requests_in_one_write() {
    let c = Cluster::three();
    let mut raw = c.raw(2);
    let mut out = bytes::BytesMut::new();
    for i in 0..500 {
        causeway_resp::encode_request(&[b"SET", format!("p{i}").as_bytes(), format!("{i}").as_bytes()], &mut out);
        causeway_resp::encode_request(&[b"GET", format!("p{i}").as_bytes()], &mut out);
    }
    raw.send(&out);
    for i in 0..500 {
        assert_eq!(raw.read_frame(), simple("OK"), "SET {i}");
        assert_eq!(raw.read_frame(), bulk(format!("{i}").as_bytes()), "GET {i}");
    }
}

/// Peer and coordinator traffic is accepted only from a node that proves
/// the cluster secret: a forged peer connection (no proof, a wrong one, or
/// chain traffic before the proof) cannot install a configuration, and a
/// node id outside the configuration may only send its own heartbeats.
#[test]
fn forged_peer_connections_are_refused() {
    use causeway_core::message::{Hello, Message, BINARY_MAGIC};
    use causeway_core::wire::put_frame;
    let c = Cluster::three();
    let epoch = || -> u64 {
        let s: String = redis::cmd("CW.STATUS").query(&mut c.conn(0)).unwrap();
        s.lines().find_map(|l| l.strip_prefix("epoch:")).unwrap().trim().parse().unwrap()
    };
    let before = epoch();
    let nodes = (0..3).map(|i| causeway_core::ring::NodeInfo { id: i as u16, addr: c.addr(i) }).collect();
    let forged = causeway_core::ring::Topology::new(
        before + 100,
        causeway_core::ring::Shape { partitions: 64, replicas: 1, k: 1, coding: None },
        nodes,
    )
    .unwrap();
    let reconfigure = Message::Reconfigure { topology: Box::new(forged) };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // 1. No proof: the hello is followed by a Reconfigure at once.
        // 2. A wrong secret. 3. The right secret, as a node id that is not
        // in the configuration.
        for (hello, secret) in [
            (Hello::Node { id: 1, stream: 1 }, None),
            (Hello::Node { id: 1, stream: 1 }, Some("guess")),
            (Hello::Node { id: 77, stream: 1 }, Some(CLUSTER_SECRET)),
        ] {
            let mut s = tokio::net::TcpStream::connect(c.addr(0)).await.unwrap();
            let mut out = bytes::BytesMut::from(&[BINARY_MAGIC][..]);
            put_frame(&hello, &mut out);
            s.write_all(&out).await.unwrap();
            if let Some(secret) = secret {
                let _ = causeway_node::runtime::auth::prove(&mut s, &hello, secret).await;
            }
            out.clear();
            // Frames from a node carry their sequence number.
            put_frame(&(1u64, &reconfigure), &mut out);
            let _ = s.write_all(&out).await;
            let mut rest = Vec::new();
            let _ = tokio::time::timeout(std::time::Duration::from_millis(500), s.read_to_end(&mut rest)).await;
        }
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(epoch(), before, "a forged Reconfigure was installed");
    // The site still works, and says why it refused.
    let _: () = redis::Commands::set(&mut c.conn(0), "after-forgery", "ok").unwrap();
    assert!(c.nodes[0].stderr().contains("refused a peer connection"), "{}", c.logs());
}

//! Identifier-first disaster recovery over real processes: site 1 backs up
//! site 0 (`--dr 0=1`) across an emulated 5 ms link. Many Redis clients
//! write at site 0, values from a few bytes to 64 KB; the link is cut in
//! the middle of it (site 0 is lost), site 1 fails over
//! (`CW.DR FAILOVER`), and every key is read through every node of site
//! 1: none may be older than its last acknowledged write; a key whose
//! value never arrived answers `-LOST` and is listed by `CW.DR MISSING`;
//! a SET clears it. No timing thresholds: every wait is for a condition.

mod common;

use common::{eventually, free_ports, Cluster, Opts};
use redis::Commands;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);
const WRITERS: usize = 8;
const KEYS_PER_WRITER: usize = 25;

/// Two sites of three nodes, site 1 the backup of site 0, 5 ms apart.
fn pair() -> Vec<Cluster> {
    let ports: Vec<Vec<u16>> = (0..2).map(|_| free_ports(3)).collect();
    (0..2)
        .map(|s| {
            let other = 1 - s;
            let addrs: Vec<String> = ports[other].iter().map(|p| format!("127.0.0.1:{p}")).collect();
            let mut opts = Opts::new(3, 3, 2)
                .flag("--partitions", 8)
                .flag("--site", s)
                .flag("--remote-site", format!("{other}={}", addrs.join(",")))
                .flag("--wan-delay", format!("{other}=5"))
                .flag("--dr", "0=1")
                .flag("--request-timeout-ms", 4_000);
            opts.ports = Some(ports[s].clone());
            Cluster::start_with(opts)
        })
        .collect()
}

/// What one writer did to its own keys: every value it sent, in order,
/// and the index of the last one acknowledged.
#[derive(Default)]
struct Written {
    sent: BTreeMap<String, Vec<String>>,
    acked: BTreeMap<String, usize>,
}

#[test]
fn after_a_failover_the_backup_serves_no_acknowledged_key_older_and_names_the_lost_ones() {
    let mut sites = pair();
    // A stabilizer replica of the backup restarted without its notes (no
    // data dir here) catches up on them from the others before a failover
    // counts it (`notes_whole`).
    sites[1].kill(2);
    sites[1].restart(2);
    eventually(WAIT, "the restarted backup node to hold whole notes again", || {
        let status: String = redis::cmd("CW.DR").arg("STATUS").query(&mut sites[1].conn(2)).ok()?;
        status.contains("notes_whole:1").then_some(())
    });
    // Before the disaster: a write at the primary is noted at the backup.
    let mut at0 = sites[0].conn(0);
    let _: () = at0.set("first", "1").unwrap();
    let status: String = redis::cmd("CW.DR").arg("STATUS").query(&mut sites[1].conn(0)).unwrap();
    assert!(status.contains("role:backup") && status.contains("primary:0"), "{status}");
    let err = redis::cmd("CW.DR").arg("FAILOVER").query::<i64>(&mut at0).unwrap_err();
    assert!(err.to_string().contains("is the primary"), "{err}");

    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let client = sites[0].client(w % 3);
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut con = client.get_connection().unwrap();
                let mut done = Written::default();
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("w{w}k{}", i % KEYS_PER_WRITER);
                    // Sizes from a few bytes to 64 KB: the note carries none.
                    let value = format!("w{w}i{i}:").repeat(1 << (i % 14));
                    let sent = done.sent.entry(key.clone()).or_default();
                    sent.push(value.clone());
                    let at = sent.len() - 1;
                    // An error leaves the write unacknowledged (the link is
                    // gone): its fate is unknown; the writer goes on.
                    if con.set::<_, _, ()>(&key, &value).is_ok() {
                        done.acked.insert(key, at);
                    }
                    i += 1;
                }
                done
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1_000));
    // The primary's shipments fall behind: its leader, which ships the ids
    // the backup applies values by, now reaches site 1 a second late
    // (heads on other nodes still note their writes at once).
    let info: String = redis::cmd("CW.SITES").query(&mut sites[0].conn(0)).unwrap();
    let leader: usize = info.lines().find_map(|l| l.strip_prefix("leader:")).unwrap().trim().parse().unwrap();
    let _: () = redis::cmd("CW.WAN").arg("DELAY").arg(1).arg(1_000).query(&mut sites[0].conn(leader)).unwrap();
    std::thread::sleep(Duration::from_millis(1_500));
    // Site 0 is lost: its link to site 1 cut on every node of both sites.
    for c in &sites {
        for n in 0..c.len() {
            let _: () = redis::cmd("CW.WAN").arg("CUT").arg(1 - c_site(c, &sites)).query(&mut c.conn(n)).unwrap();
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let written: Vec<Written> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    let acked: usize = written.iter().map(|w| w.acked.len()).sum();
    assert!(acked > 0, "no write was acknowledged before the cut");

    // What the backup's replicas know and have not got (CW.DR STATUS, and
    // INFO's geo section).
    let field = |text: &str, name: &str| -> u64 { text.lines().find_map(|l| l.strip_prefix(name)).unwrap().trim().parse().unwrap() };
    let (mut keys, mut bytes) = (0, 0);
    for n in 0..sites[1].len() {
        let status: String = redis::cmd("CW.DR").arg("STATUS").query(&mut sites[1].conn(n)).unwrap();
        keys += field(&status, "unfinished_keys:");
        bytes += field(&status, "unfinished_bytes:");
        let info: String = redis::cmd("INFO").arg("geo").query(&mut sites[1].conn(n)).unwrap();
        assert!(info.contains("dr_role:backup"), "{info}");
    }
    assert!(keys > 0 && bytes > keys * 8, "the backlog: {keys} keys, {bytes} bytes");
    // The backup fails over: every node then refuses the lost keys.
    let lost: i64 = redis::cmd("CW.DR").arg("FAILOVER").query(&mut sites[1].conn(1)).unwrap();
    let mut refused = BTreeSet::new();
    let (mut complete, mut stale) = (0, Vec::new());
    for n in 0..sites[1].len() {
        let mut con = sites[1].conn(n);
        for w in &written {
            for (key, &last) in &w.acked {
                match con.get::<_, Option<String>>(key) {
                    Ok(Some(v)) => match w.sent[key].iter().position(|s| *s == v) {
                        Some(i) if i >= last => complete += 1,
                        i => stale.push(format!("{key}: read value #{i:?} of {}, acknowledged #{last}", w.sent[key].len())),
                    },
                    Ok(None) => stale.push(format!("{key}: missing, acknowledged #{last}")),
                    Err(e) if e.code() == Some("LOST") => {
                        assert!(e.to_string().contains(key.as_str()), "the error names the key: {e}");
                        refused.insert(key.clone());
                    }
                    Err(e) => panic!("node {n}: GET {key}: {e}"),
                }
            }
        }
    }
    assert!(stale.is_empty(), "served older than acknowledged after the failover:\n{}", stale.join("\n"));
    assert!(refused.len() as i64 <= lost, "{} keys refused, the failover counted {lost}", refused.len());
    println!("{acked} keys acknowledged: {complete} reads complete, {} keys refused; failover counted {lost}", refused.len());
    assert!(!refused.is_empty(), "no key was refused: the backup had every value the primary acknowledged");

    // CW.DR MISSING lists every refused key, with the write it misses.
    let mut listed = BTreeSet::new();
    let mut cursor = "0".to_string();
    loop {
        let (next, items): (String, Vec<String>) =
            redis::cmd("CW.DR").arg("MISSING").arg(&cursor).arg("COUNT").arg(7).query(&mut sites[1].conn(2)).unwrap();
        for pair in items.chunks(2) {
            assert!(pair[1].contains("@0"), "a write of site 0: {pair:?}");
            listed.insert(pair[0].clone());
        }
        if next == "0" {
            break;
        }
        cursor = next;
    }
    assert_eq!(listed.len() as i64, lost);
    assert!(refused.is_subset(&listed), "refused but not listed: {:?}", refused.difference(&listed).collect::<Vec<_>>());

    // A SET of a refused key clears it, everywhere.
    {
        let key = refused.iter().next().unwrap();
        let mut con = sites[1].conn(0);
        let err = redis::cmd("SET").arg(key).arg("x").arg("NX").query::<Option<String>>(&mut con).unwrap_err();
        assert_eq!(err.code(), Some("LOST"), "{err}");
        let _: () = con.set(key, "fresh").unwrap();
        for n in 0..sites[1].len() {
            let mut c = sites[1].conn(n);
            eventually(WAIT, "the fresh value everywhere", || {
                (c.get::<_, Option<String>>(key).ok()? == Some("fresh".into())).then_some(())
            });
        }
    }
    let status: String = redis::cmd("CW.DR").arg("STATUS").query(&mut sites[1].conn(0)).unwrap();
    assert!(status.contains("failed_over:1"), "{status}");
}

/// Which site `c` is, among `sites`.
fn c_site(c: &Cluster, sites: &[Cluster]) -> usize {
    sites.iter().position(|s| std::ptr::eq(s, c)).unwrap()
}

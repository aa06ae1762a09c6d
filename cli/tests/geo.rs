//! Several sites as real processes (each its own nodes, chains and
//! coordinator) joined by emulated wide-area links, driven by a real Redis
//! client. No timing thresholds: every wait is for a condition, with a
//! generous deadline.

mod common;

use common::{eventually, free_ports, run_causeway, Cluster, Opts};
use redis::Commands;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

/// `delays[a][b]`: the one-way delay from site a to site b, in ms.
fn sites(delays: &[[u64; 3]; 3]) -> Vec<Cluster> {
    sites_with(delays, |opts| opts)
}

/// `sites`, each node's options passed through `tune`.
fn sites_with(delays: &[[u64; 3]; 3], tune: impl Fn(Opts) -> Opts) -> Vec<Cluster> {
    let ports: Vec<Vec<u16>> = (0..3).map(|_| free_ports(3)).collect();
    (0..3)
        .map(|s| {
            let mut opts = tune(Opts::new(3, 3, 2)).flag("--partitions", 8).flag("--site", s).flag("--wan-jitter-ms", 3);
            let mut wan = Vec::new();
            for t in (0..3).filter(|&t| t != s) {
                let addrs: Vec<String> = ports[t].iter().map(|p| format!("127.0.0.1:{p}")).collect();
                opts = opts.flag("--remote-site", format!("{t}={}", addrs.join(",")));
                wan.push(format!("{t}={}", delays[s][t]));
            }
            opts = opts.flag("--wan-delay", wan.join(","));
            opts.ports = Some(ports[s].clone());
            Cluster::start_with(opts)
        })
        .collect()
}

fn paper() -> [[u64; 3]; 3] {
    [[0, 40, 40], [40, 0, 80], [40, 80, 0]]
}

fn get(c: &Cluster, node: usize, key: &str) -> Option<String> {
    c.conn(node).get(key).ok().flatten()
}

/// Every site holds `value` for `key`, read at each node.
fn everywhere(sites: &[Cluster], key: &str, value: &str) -> bool {
    sites.iter().all(|c| (0..c.len()).all(|n| get(c, n, key).as_deref() == Some(value)))
}

/// A client in site 1 reads a write of site 0, then writes; site 2 hears
/// from site 1 quickly and from site 0 slowly, so it often receives the
/// second write first. It must never show it without the first: whoever in
/// site 2 sees y{r} sees x{r} too.
#[test]
fn a_write_is_never_seen_before_what_its_writer_had_read_from_a_third_site() {
    let mut delays = paper();
    delays[0][2] = 400;
    delays[2][0] = 400;
    delays[1][2] = 10;
    delays[2][1] = 10;
    let sites = sites(&delays);
    let (mut at0, mut at1, mut at2) = (sites[0].conn(0), sites[1].conn(1), sites[2].conn(2));
    for r in 0..20 {
        let (x, y) = (format!("x{r}"), format!("y{r}"));
        let _: () = at0.set(&x, r).unwrap();
        eventually(WAIT, "site 1 sees x", || (at1.get::<_, Option<i64>>(&x).unwrap() == Some(r)).then_some(()));
        let _: () = at1.set(&y, r).unwrap();
        eventually(WAIT, "site 2 sees y", || {
            let got_y: Option<i64> = at2.get(&y).unwrap();
            if got_y != Some(r) {
                return None;
            }
            // y is here: x, which y's writer had read, must be too.
            let got_x: Option<i64> = at2.get(&x).unwrap();
            assert_eq!(got_x, Some(r), "round {r}: site 2 shows y{r} without x{r}");
            Some(())
        });
    }
    // y arrived ~390 ms before x each round, and waited for it. Site 2
    // saw site 0's updates no sooner than their 400 ms link allows, and
    // site 1's no sooner than 10 ms (in fact far later: each waited for an
    // x); every node of it says so (the leader's summary).
    for n in 0..sites[2].len() {
        let mut c = sites[2].conn(n);
        eventually(WAIT, "site 2's visibility summary", || {
            let info: String = redis::cmd("CW.SITES").query(&mut c).unwrap();
            // Summarized once a second: every update of both sites in.
            let count = |site: &str| -> Option<u64> {
                let line = info.lines().find_map(|l| l.strip_prefix(site))?;
                line.split(',').find_map(|f| f.strip_prefix("visible_count="))?.parse().ok()
            };
            (count("site0:")? >= 20 && count("site1:")? >= 20).then_some(())
        });
        let info: String = redis::cmd("CW.SITES").query(&mut c).unwrap();
        for (site, link_ms) in [("site0:", 400), ("site1:", 10)] {
            let line = info.lines().find_map(|l| l.strip_prefix(site)).unwrap();
            let field = |name: &str| -> u64 { line.split(',').find_map(|f| f.strip_prefix(name)).unwrap().parse().unwrap() };
            assert!(field("visible_p50_ms=") >= link_ms && field("visible_p99_ms=") >= field("visible_p50_ms="), "{info}");
        }
    }
}

/// Clients in every site write the same keys at once; once quiet, every
/// node of every site holds the same value for each key (last writer wins
/// on (timestamp, site)), and the conflicts were counted.
#[test]
fn concurrent_writes_converge_everywhere() {
    let sites = sites(&paper());
    let writers: Vec<_> = (0..3)
        .map(|s| {
            let client = sites[s].client(s % 3);
            std::thread::spawn(move || {
                let mut con = client.get_connection().unwrap();
                for i in 0..200 {
                    let _: () = con.set(format!("k{}", i % 10), format!("s{s}-{i}")).unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    for k in 0..10 {
        let key = format!("k{k}");
        eventually(WAIT, "every site agrees", || {
            let first = get(&sites[0], 0, &key)?;
            everywhere(&sites, &key, &first).then_some(())
        });
    }
    let conflicts: u64 = sites
        .iter()
        .flat_map(|c| (0..c.len()).map(move |n| (c, n)))
        .map(|(c, n)| {
            let info: String = redis::cmd("CW.SITES").query(&mut c.conn(n)).unwrap();
            info.lines().find_map(|l| l.strip_prefix("conflicts:")).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0)
        })
        .sum();
    assert!(conflicts > 0, "three sites writing ten keys at once must overwrite each other");
    // Each node lists the latest ones its heads resolved: key, kept, lost.
    let listed: Vec<String> = sites
        .iter()
        .flat_map(|c| (0..c.len()).map(move |n| (c, n)))
        .flat_map(|(c, n)| redis::cmd("CW.CONFLICTS").arg(5).query::<Vec<String>>(&mut c.conn(n)).unwrap())
        .collect();
    assert!(!listed.is_empty() && listed.len() <= 45, "{listed:?}");
    for line in &listed {
        let parts: Vec<&str> = line.split(' ').collect();
        assert!(parts.len() == 3 && parts[0].starts_with('k') && parts[1].starts_with("kept=") && parts[2].starts_with("lost="), "{line}");
        assert_ne!(parts[1][5..], parts[2][5..], "{line}");
    }
}

/// The Eunomia paper's baselines (`--replication eventual`, no causal
/// order; `sequenced`, a site sequencer in every write's path) run as real
/// processes: writes from every site converge everywhere, CW.SITES names
/// the mode, and with a sequencer every write got a number from it.
#[test]
fn the_baselines_converge_as_real_processes() {
    for mode in ["eventual", "sequenced"] {
        let sites = sites_with(&paper(), |opts| opts.flag("--replication", mode));
        for (s, site) in sites.iter().enumerate() {
            let mut con = site.conn(s % 3);
            for i in 0..30 {
                let _: () = con.set(format!("{mode}{}", i % 6), format!("s{s}-{i}")).unwrap();
            }
        }
        for k in 0..6 {
            let key = format!("{mode}{k}");
            eventually(WAIT, "every site agrees", || {
                let first = get(&sites[0], 0, &key)?;
                everywhere(&sites, &key, &first).then_some(())
            });
        }
        let infos: Vec<String> = sites
            .iter()
            .flat_map(|c| (0..c.len()).map(move |n| (c, n)))
            .map(|(c, n)| redis::cmd("CW.SITES").query(&mut c.conn(n)).unwrap())
            .collect();
        assert!(infos.iter().all(|i| i.contains(&format!("replication:{mode}"))), "{infos:?}");
        if mode == "sequenced" {
            let numbered: u64 = infos
                .iter()
                .filter_map(|i| i.lines().find_map(|l| l.strip_prefix("sequenced:")).and_then(|v| v.trim().parse::<u64>().ok()))
                .sum();
            assert!(numbered >= 90, "90 writes, {numbered} numbers handed out: {infos:?}");
        }
    }
}

/// Site 2 is cut off (`causeway cluster link cut`, at its nodes only): it
/// keeps serving reads and writes, sees nothing of the others, and they
/// nothing of it; once the link is back, every write from both sides of
/// the cut is everywhere.
#[test]
fn a_site_cut_off_keeps_serving_and_catches_up() {
    let sites = sites(&paper());
    let link = |change: &str, other: u16| {
        let (addr, other) = (sites[2].addr(1), other.to_string());
        let (ok, out, err) = run_causeway(&["cluster", "--addr", &addr, "link", change, &other]);
        assert!(ok && out.contains("OK"), "causeway cluster link {change} {other}: {out}{err}");
    };
    link("cut", 0);
    link("cut", 1);
    let (ok, _, err) = run_causeway(&["cluster", "--addr", &sites[2].addr(0), "link", "cut", "9"]);
    assert!(!ok && err.contains("site"), "a site not in the configuration is refused: {err}");
    let mut at0 = sites[0].conn(0);
    let mut at2 = sites[2].conn(0);
    for i in 0..50 {
        let _: () = at0.set(format!("a{i}"), i).unwrap();
        let _: () = at2.set(format!("b{i}"), i).unwrap();
    }
    eventually(WAIT, "site 1 has site 0's writes", || everywhere(&sites[..2], "a49", "49").then_some(()));
    assert_eq!(get(&sites[2], 1, "a49"), None, "site 2 is cut off");
    assert_eq!(get(&sites[0], 1, "b49"), None, "site 2's writes cannot get out");
    let status: String = redis::cmd("CW.SITES").query(&mut at2).unwrap();
    assert!(status.contains("link=cut"), "{status}");
    // Cut off, site 2's view of site 0 stands still: its lag grows with
    // the clock.
    let site0 = |status: &str, field: &str| -> u64 {
        let line = status.lines().find_map(|l| l.strip_prefix("site0:")).unwrap();
        line.split(',').find_map(|f| f.strip_prefix(field)).unwrap().parse().unwrap()
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let later: String = redis::cmd("CW.SITES").query(&mut at2).unwrap();
    assert_eq!(site0(&later, "applied_ms="), site0(&status, "applied_ms="), "{status}\n{later}");
    assert!(site0(&later, "lag_ms=") >= site0(&status, "lag_ms=") + 300, "{status}\n{later}");
    link("restore", 0);
    link("restore", 1);
    for i in 0..50 {
        eventually(WAIT, "everything everywhere after the cut", || {
            (everywhere(&sites, &format!("a{i}"), &i.to_string()) && everywhere(&sites, &format!("b{i}"), &i.to_string())).then_some(())
        });
    }
}

/// The node that leads site 0 (ships its updates, applies the others') is
/// killed: another takes over, and writes on both sides keep flowing.
#[test]
fn the_leader_of_a_site_is_killed_and_replication_goes_on() {
    let mut sites = sites(&paper());
    let _: () = sites[0].conn(1).set("before", 1).unwrap();
    eventually(WAIT, "the first write everywhere", || everywhere(&sites, "before", "1").then_some(()));
    let status: String = redis::cmd("CW.SITES").query(&mut sites[0].conn(1)).unwrap();
    assert!(status.contains("leader:0"), "node 0 leads a site that just started: {status}");
    sites[0].kill(0);
    let mut at0 = eventually(WAIT, "site 0 takes writes again", || {
        let mut con = sites[0].conn(1);
        con.set::<_, _, ()>("after", 2).ok().map(|()| con)
    });
    let _: () = at0.set("after2", 3).unwrap();
    // CW.WAIT under the new leader: it returns once every site has it.
    let _: () = redis::cmd("CW.WAIT").arg("ALL").arg(20_000).query(&mut at0).unwrap();
    let _: () = redis::cmd("CW.WAIT").arg("SITE").arg(0).arg(1).query(&mut at0).expect("its own site has the session's writes");
    assert!(sites[1..].iter().all(|c| get(c, 0, "after2").as_deref() == Some("3")), "CW.WAIT ALL returned before every site had it");
    let _: () = sites[1].conn(0).set("from1", 4).unwrap();
    let live0 = [1, 2];
    eventually(WAIT, "site 0's writes reach the others", || {
        sites[1..].iter().all(|c| (0..3).all(|n| get(c, n, "after2").as_deref() == Some("3"))).then_some(())
    });
    eventually(WAIT, "site 1's write reaches site 0 under its new leader", || {
        live0.iter().all(|&n| get(&sites[0], n, "from1").as_deref() == Some("4")).then_some(())
    });
}

/// A session moves between sites (`CW.SESSION EXPORT` in one, `RESUME` in
/// another): resuming waits until the new site has applied what the
/// session wrote, so it reads its own writes there; `CW.WAIT` waits until
/// a write is applied in another site, or names the sites it is missing.
#[test]
fn sessions_move_between_sites_and_wait_for_their_writes() {
    let mut delays = paper();
    delays[0][1] = 300;
    delays[1][0] = 300;
    let sites = sites(&delays);
    let mut at0 = sites[0].conn(0);
    let _: () = at0.set("x", "old").unwrap();
    eventually(WAIT, "the first value everywhere", || everywhere(&sites, "x", "old").then_some(()));
    // Acknowledged by the tail: stable, so the session keeps no entry for
    // x, only its causal past (what the new site must wait for).
    let _: () = redis::cmd("CW.WITH").arg("linearizable").arg("SET").arg("x").arg("new").query(&mut at0).unwrap();
    let token: String = redis::cmd("CW.SESSION").arg("EXPORT").query(&mut at0).unwrap();
    assert_eq!(get(&sites[1], 0, "x").as_deref(), Some("old"), "the write is still on its way (300 ms)");
    let mut moved = sites[1].conn(1);
    let _: () = redis::cmd("CW.SESSION").arg("RESUME").arg(&token).query(&mut moved).unwrap();
    assert_eq!(moved.get::<_, Option<String>>("x").unwrap().as_deref(), Some("new"), "read-your-writes after moving");

    let _: () = at0.set("y", 1).unwrap();
    let _: () = redis::cmd("CW.WAIT").arg("SITE").arg(1).arg(10_000).query(&mut at0).unwrap();
    assert_eq!(get(&sites[1], 2, "y").as_deref(), Some("1"), "CW.WAIT SITE 1 returned: site 1 has it");
    for n in 0..3 {
        let _: () = redis::cmd("CW.WAN").arg("CUT").arg(0).query(&mut sites[2].conn(n)).unwrap();
    }
    let own = redis::cmd("CW.WAN").arg("CUT").arg(2).query::<()>(&mut sites[2].conn(0)).unwrap_err();
    assert!(own.to_string().contains("this node's own site"), "{own}");
    let _: () = at0.set("z", 1).unwrap();
    let err = redis::cmd("CW.WAIT").arg("ALL").arg(500).query::<()>(&mut at0).unwrap_err();
    assert!(err.to_string().contains("TIMEOUT") && err.to_string().contains('2'), "{err}");
    // The session cannot move to site 2 while z cannot reach it: RESUME
    // waits (the request timeout), then says why, and the connection keeps
    // its own session.
    let token: String = redis::cmd("CW.SESSION").arg("EXPORT").query(&mut at0).unwrap();
    let mut cut_off = sites[2].conn(0);
    let err = redis::cmd("CW.SESSION").arg("RESUME").arg(&token).query::<()>(&mut cut_off).unwrap_err();
    assert!(err.to_string().contains("depends on writes of site(s) 0"), "{err}");
    assert_eq!(cut_off.get::<_, Option<String>>("z").unwrap(), None, "z never reached site 2");
}

/// A whole site is killed (every node, kill -9) while the others keep
/// writing, and started again from its logs (`--fsync always`): it catches
/// up on what it missed without a full copy, and the writes it had
/// acknowledged before the crash, shipped or not, reach the other sites.
#[test]
fn a_whole_site_restarted_from_its_logs_catches_up() {
    let mut sites = sites_with(&paper(), |opts| opts.durable().flag("--fsync", "always"));
    let mut at2 = sites[2].conn(0);
    for i in 0..30 {
        let _: () = at2.set(format!("c{i}"), i).unwrap();
    }
    for n in 0..3 {
        sites[2].kill(n);
    }
    let (mut at0, mut at1) = (sites[0].conn(1), sites[1].conn(2));
    for i in 0..50 {
        let _: () = at0.set(format!("a{i}"), i).unwrap();
        let _: () = at1.set(format!("b{i}"), i).unwrap();
    }
    for n in 0..3 {
        sites[2].restart(n);
    }
    sites[2].wait_serving(&[0, 1, 2]);
    let _: () = sites[2].conn(1).set("after", "restart").unwrap();
    // Each client's writes are causally ordered: a site that shows its last
    // one shows all the others.
    eventually(WAIT, "the last writes everywhere after the restart", || {
        (everywhere(&sites, "a49", "49")
            && everywhere(&sites, "b49", "49")
            && everywhere(&sites, "c29", "29")
            && everywhere(&sites, "after", "restart"))
        .then_some(())
    });
    for i in 0..50 {
        assert!(everywhere(&sites, &format!("a{i}"), &i.to_string()) && everywhere(&sites, &format!("b{i}"), &i.to_string()), "a{i} b{i}");
    }
    for i in 0..30 {
        assert!(everywhere(&sites, &format!("c{i}"), &i.to_string()), "c{i}: written in site 2 before it was killed");
    }
}

//! INFO [section ...]
//!
//! The sections Redis tools read (server, clients, memory, cpu, stats,
//! persistence, replication, commandstats, errorstats, latencystats,
//! keyspace) plus Causeway's own fields in replication, tier (the disk
//! tier, with `--disk-tier`) and geo (`CW.SITES`), as one bulk string of `# Section` headers and
//! `field:value` lines. Sections are named in any case; `default` (or no
//! argument) is every section but commandstats and latencystats, `all` and
//! `everything` are every one, as in Redis 7. Unknown names are skipped, as
//! Redis does, so INFO never answers with an error.
//!
//! The per-command sections print as Redis 7 prints them (`stats.rs` says
//! what is counted), a line per command or subcommand called since start
//! or CONFIG RESETSTAT:
//!
//! ```text
//! # Commandstats
//! cmdstat_set:calls=2,usec=35,usec_per_call=17.50,rejected_calls=1,failed_calls=0
//! cmdstat_client|setname:calls=1,usec=3,usec_per_call=3.00,rejected_calls=0,failed_calls=0
//! # Errorstats
//! errorstat_ERR:count=1
//! # Latencystats
//! latency_percentiles_usec_set:p50=16.063,p99=19.071,p99.9=19.071
//! ```

use super::Outcome;
use crate::redis::conn::Conn;
use crate::redis::stats::{at_percentile, Stats};
use crate::runtime::Status;
use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_resp::Frame;
use std::fmt::Write;
use std::sync::atomic::Ordering;

/// The sections INFO knows, in the order it prints them.
const SECTIONS: [&str; 14] = [
    "server",
    "clients",
    "memory",
    "tier",
    "cpu",
    "stats",
    "persistence",
    "replication",
    "geo",
    "ec",
    "commandstats",
    "errorstats",
    "latencystats",
    "keyspace",
];

/// The sections only `all` and `everything` print unless named: a line
/// per command each.
const NOT_DEFAULT: [&str; 2] = ["commandstats", "latencystats"];

/// The percentiles INFO latencystats shows, as Redis 7 names them by
/// default (`latency-tracking-info-percentiles`).
const PERCENTILES: [(&str, f64); 3] = [("p50", 50.0), ("p99", 99.0), ("p99.9", 99.9)];

pub async fn run(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let status = conn.node.status();
    let mut text = String::new();
    for section in sections(&args) {
        if !text.is_empty() {
            text.push_str("\r\n");
        }
        let mut title = section.to_string();
        title[..1].make_ascii_uppercase();
        text.push_str(&format!("# {title}\r\n"));
        let stats = &conn.server.stats;
        match section {
            "commandstats" => commandstats(stats, &mut text),
            "errorstats" => errorstats(stats, &mut text),
            "latencystats" => latencystats(stats, &mut text),
            _ => {
                for (k, v) in section_fields(conn, &status, section).await {
                    text.push_str(&format!("{k}:{v}\r\n"));
                }
            }
        }
        if section == "geo" {
            for (k, v) in super::cw::sites::fields(conn.node.config(), status.geo.as_ref(), conn.server.clock.now_ms()) {
                text.push_str(&format!("{k}:{v}\r\n"));
            }
        }
    }
    Frame::Bulk(Bytes::from(text)).into()
}

/// The sections INFO's arguments ask for, in printing order.
fn sections(args: &[Bytes]) -> Vec<&'static str> {
    let asked: Vec<String> = args[1..].iter().map(|a| String::from_utf8_lossy(a).to_lowercase()).collect();
    let all = asked.iter().any(|a| matches!(a.as_str(), "all" | "everything"));
    let default = asked.is_empty() || asked.iter().any(|a| a == "default");
    SECTIONS.into_iter().filter(|s| all || (default && !NOT_DEFAULT.contains(s)) || asked.iter().any(|a| a == s)).collect()
}

/// `cmdstat_<name>:calls=N,usec=N,usec_per_call=F,rejected_calls=N,failed_calls=N`
/// for each command with a call, rejected or not (Redis's
/// `genRedisInfoStringCommandStats`, which divides in single precision).
fn commandstats(stats: &Stats, text: &mut String) {
    for (row, name) in super::rows() {
        let c = stats.calls(row);
        if c.calls == 0 && c.rejected == 0 && c.failed == 0 {
            continue;
        }
        let usec = c.nanos / 1000;
        let per_call = if c.calls == 0 { 0.0 } else { usec as f32 / c.calls as f32 };
        let _ = write!(
            text,
            "cmdstat_{name}:calls={},usec={usec},usec_per_call={per_call:.2},rejected_calls={},failed_calls={}\r\n",
            c.calls, c.rejected, c.failed
        );
    }
}

/// `errorstat_<CODE>:count=N` for each error code replied, in byte order.
fn errorstats(stats: &Stats, text: &mut String) {
    for (code, n) in &stats.errors().by_code {
        let _ = write!(text, "errorstat_{code}:count={n}\r\n");
    }
}

/// `latency_percentiles_usec_<name>:p50=F,p99=F,p99.9=F` for each command
/// that ran, in microseconds (Redis's `fillPercentileDistributionLatencies`).
fn latencystats(stats: &Stats, text: &mut String) {
    for (row, name) in super::rows() {
        let c = stats.calls(row);
        let Some(h) = &c.latency else { continue };
        let values: Vec<String> =
            PERCENTILES.iter().map(|(label, p)| format!("{label}={:.3}", at_percentile(h, *p) as f64 / 1000.0)).collect();
        let _ = write!(text, "latency_percentiles_usec_{name}:{}\r\n", values.join(","));
    }
}

async fn section_fields(conn: &mut Conn, status: &Status, section: &str) -> Vec<(&'static str, String)> {
    let server = conn.server.clone();
    let stat = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed).to_string();
    match section {
        "server" => vec![
            ("redis_version", "7.0.0".into()),
            ("causeway_version", env!("CARGO_PKG_VERSION").into()),
            ("process_id", std::process::id().to_string()),
            ("node_id", status.me.to_string()),
            ("tcp_port", conn.node.config().listen.rsplit(':').next().unwrap_or("").into()),
            ("uptime_in_seconds", status.uptime.as_secs().to_string()),
        ],
        "clients" => vec![("connected_clients", stat(&server.stats.connections))],
        "memory" => memory_fields(status),
        "tier" => tier_fields(status),
        "ec" => ec_fields(status),
        "cpu" => {
            let (user, sys) = proc_self::cpu_seconds().unwrap_or_default();
            vec![("used_cpu_sys", format!("{sys:.6}")), ("used_cpu_user", format!("{user:.6}"))]
        }
        "stats" => vec![
            ("total_connections_received", stat(&server.stats.total_connections)),
            ("total_commands_processed", stat(&server.stats.commands)),
            ("instantaneous_ops_per_sec", stat(&server.stats.ops_per_sec)),
            ("keyspace_hits", stat(&server.stats.keyspace_hits)),
            ("keyspace_misses", stat(&server.stats.keyspace_misses)),
            ("total_error_replies", server.stats.errors().total.to_string()),
            ("expired_keys", status.expired_keys.to_string()),
            ("evicted_keys", status.evicted_keys.to_string()),
        ],
        "persistence" => match &status.wal {
            Some(wal) => vec![
                ("aof_enabled", "1".into()),
                ("aof_fsync", wal.fsync.into()),
                ("aof_current_size", wal.bytes.to_string()),
                ("aof_last_fsync_ms_ago", server.clock.now_ms().saturating_sub(wal.last_sync_ms).to_string()),
            ],
            None => vec![("aof_enabled", "0".into())],
        },
        "replication" => {
            let topology = &status.topology;
            let causeway_core::ring::Roles { head, middle, tail } = topology.roles(status.me);
            let sent = &status.peer_sent;
            vec![
                ("role", "master".into()),
                ("serving", if status.admitted { "yes" } else { "no" }.into()),
                ("lease", if status.lease { "held" } else { "none" }.into()),
                ("epoch", topology.epoch.to_string()),
                ("partitions", topology.shape.partitions.to_string()),
                ("replicas", topology.shape.replicas.to_string()),
                ("k", topology.shape.k.to_string()),
                ("head_of", head.to_string()),
                ("middle_of", middle.to_string()),
                ("tail_of", tail.to_string()),
                ("consistency", conn.driver.consistency().to_string()),
                ("peer_backlog_bytes", status.peer_backlog.to_string()),
                ("peer_dropped_messages", status.peer_dropped.to_string()),
                ("peer_messages_sent", sent.messages().to_string()),
                ("peer_bytes_sent", sent.bytes.to_string()),
                ("peer_messages_by_kind", sent.kinds.iter().map(|(k, n)| format!("{k}={n}")).collect::<Vec<_>>().join(",")),
                ("state_transfers_suffix", status.suffix_transfers.to_string()),
                ("state_transfers_whole", status.whole_transfers.to_string()),
                ("parked_writes_total", status.parked_writes.0.to_string()),
                ("parked_writes", status.parked_writes.1.to_string()),
            ]
        }
        "keyspace" => match conn.run(Request::Count).await {
            // The whole site's keys, counted at the heads (like DBSIZE).
            Ok(Response::Count(k)) if k.keys > 0 => vec![("db0", format!("keys={},expires={},avg_ttl=0", k.keys, k.expires))],
            _ => Vec::new(),
        },
        _ => Vec::new(),
    }
}

/// INFO memory (and MEMORY STATS): `used_memory` is what the allocator
/// holds for this process (`Status::allocated`; the resident set if the
/// counting allocator is not installed), `used_memory_rss` what Linux
/// says is resident, `used_memory_dataset` what the replicas' stores take,
/// `mem_fragmentation_ratio` the one over the other, as Redis has them.
pub fn memory_fields(status: &Status) -> Vec<(&'static str, String)> {
    let rss = proc_self::rss_bytes().unwrap_or(0);
    let used = match status.allocated {
        0 => rss,
        n => n,
    };
    let dataset = status.store_bytes as u64;
    vec![
        ("used_memory", used.to_string()),
        ("used_memory_human", human(used)),
        ("used_memory_rss", rss.to_string()),
        ("used_memory_rss_human", human(rss)),
        ("used_memory_dataset", dataset.to_string()),
        ("mem_fragmentation_ratio", format!("{:.2}", rss as f64 / used.max(1) as f64)),
        ("mem_allocator", "mimalloc".into()),
        ("maxmemory", status.maxmemory.0.to_string()),
        ("maxmemory_human", human(status.maxmemory.0)),
        ("maxmemory_policy", status.maxmemory.1.to_string()),
    ]
}

/// INFO tier, with a disk tier: where the values are, how often a read
/// found its value in memory, and what the disk did.
/// This node's part in its site's erasure-coded groups: how it stands, what
/// it holds, how its recoveries go.
fn ec_fields(status: &Status) -> Vec<(&'static str, String)> {
    let Some(e) = &status.ec else { return vec![("ec_enabled", "0".into())] };
    let m = &e.memory;
    let list = |nodes: &[u16]| nodes.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(",");
    vec![
        ("ec_enabled", "1".into()),
        ("ec_code", format!("{}+{}", e.coding.data, e.coding.parity)),
        ("ec_epoch", e.standing.epoch.to_string()),
        ("ec_standing", e.standing.what.into()),
        ("ec_lost_nodes", list(&e.standing.lost)),
        ("ec_joining_nodes", list(&e.standing.joining)),
        ("ec_whole", u8::from(e.standing.whole).to_string()),
        ("ec_keys", m.keys.to_string()),
        ("ec_expires", m.expires.to_string()),
        ("ec_metadata_replicas", m.replicas.to_string()),
        ("ec_data_bytes", m.data.to_string()),
        ("ec_parity_bytes", m.parity.to_string()),
        ("ec_placed_bytes", m.placed.to_string()),
        ("ec_hole_bytes", m.holes.to_string()),
        ("ec_given_back_pages", m.given_back.to_string()),
        ("ec_buffered_updates", m.buffered.to_string()),
        ("ec_missing_pages", m.missing.to_string()),
        ("ec_repaired_pages", m.repaired.to_string()),
    ]
}

fn tier_fields(status: &Status) -> Vec<(&'static str, String)> {
    let Some(t) = &status.tier else { return vec![("tier_enabled", "0".into())] };
    let (s, p, u) = (&t.stats, &t.stats.places, &t.usage);
    let lookups = s.hits + s.misses;
    vec![
        ("tier_enabled", "1".into()),
        ("tier_cache_policy", t.policy.to_string()),
        ("tier_keys_in_memory", p.keys_in_memory.to_string()),
        ("tier_keys_on_disk", p.keys_on_disk.to_string()),
        ("tier_value_bytes_on_disk", p.bytes_on_disk.to_string()),
        ("tier_value_bytes_leaving", p.leaving.to_string()),
        ("tier_hits", s.hits.to_string()),
        ("tier_misses", s.misses.to_string()),
        ("tier_hit_ratio", format!("{:.4}", if lookups == 0 { 1.0 } else { s.hits as f64 / lookups as f64 })),
        ("tier_moved_out", s.moved_out.to_string()),
        ("tier_read_back", s.read_back.to_string()),
        ("tier_errors", s.errors.to_string()),
        ("tier_streamed_out", s.streamed_out.to_string()),
        ("tier_streamed_in", s.streamed_in.to_string()),
        ("tier_streams_running", s.streams_running.to_string()),
        ("tier_streams_waiting", s.streams_waiting.to_string()),
        ("tier_disk_reads", t.reads.count.to_string()),
        ("tier_disk_reads_per_sec", format!("{:.0}", t.reads.per_sec)),
        ("tier_disk_read_p99_usec", t.reads.p99_us.to_string()),
        ("tier_disk_values", u.values.to_string()),
        ("tier_disk_file_bytes", u.disk_bytes.to_string()),
        ("tier_disk_written_bytes", u.written_bytes.to_string()),
    ]
}

/// Bytes as Redis prints them for people (`1.50M`).
fn human(bytes: u64) -> String {
    let units = [("G", 1u64 << 30), ("M", 1 << 20), ("K", 1 << 10)];
    match units.iter().find(|(_, size)| bytes >= *size) {
        Some((unit, size)) => format!("{:.2}{unit}", bytes as f64 / *size as f64),
        None => format!("{bytes}B"),
    }
}

/// What Linux says about this process (INFO memory and cpu).
mod proc_self {
    /// The resident set, in bytes.
    pub fn rss_bytes() -> Option<u64> {
        let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
        let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
        Some(pages * 4096)
    }

    /// CPU time used, user and system, in seconds (Linux counts in ticks of
    /// 1/100 s).
    pub fn cpu_seconds() -> Option<(f64, f64)> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name (which may hold spaces), which ends
        // at the last ')'.
        let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let ticks = |i: usize| rest.get(i)?.parse::<f64>().ok().map(|t| t / 100.0);
        Some((ticks(11)?, ticks(12)?))
    }
}

#[cfg(test)]
mod tests {
    use super::{sections, SECTIONS};
    use crate::redis::cmd::args;

    #[test]
    fn all_or_everything_is_every_section() {
        for words in [&["INFO", "all"][..], &["INFO", "stats", "Everything"]] {
            assert_eq!(sections(&args(words)), SECTIONS, "{words:?}");
        }
    }

    /// Redis's tests/unit/info-command.tcl, "info command with at most one
    /// sub command": no argument and `default` leave out the per-command
    /// sections (errorstats stays, as in Redis 7).
    #[test]
    fn no_section_or_default_is_every_section_but_commandstats_and_latencystats() {
        let default: Vec<&str> = SECTIONS.into_iter().filter(|s| !matches!(*s, "commandstats" | "latencystats")).collect();
        for words in [&["INFO"][..], &["info", "DEFAULT"]] {
            assert_eq!(sections(&args(words)), default, "{words:?}");
        }
        assert!(default.contains(&"errorstats"));
        let mut and_commandstats = sections(&args(&["INFO", "commandstats", "default"]));
        and_commandstats.retain(|s| !default.contains(s));
        assert_eq!(and_commandstats, ["commandstats"]);
    }

    #[test]
    fn named_sections_in_any_case_print_in_info_order() {
        assert_eq!(sections(&args(&["INFO", "Keyspace", "server", "STATS"])), ["server", "stats", "keyspace"]);
        assert_eq!(sections(&args(&["INFO", "replication", "replication"])), ["replication"]);
    }

    #[test]
    fn unknown_sections_are_skipped_not_errors() {
        assert_eq!(sections(&args(&["INFO", "nosuch", "cpu"])), ["cpu"]);
        assert!(sections(&args(&["INFO", "nosuch"])).is_empty());
    }
}

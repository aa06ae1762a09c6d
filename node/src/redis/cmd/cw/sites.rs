//! CW.SITES, CW.WAIT SITE s|ALL timeout_ms, CW.CONFLICTS [count],
//! CW.WAN CUT|RESTORE site | DELAY site ms, and CW.CLOCK SKEW ms
//!
//! CW.SITES: geo-replication as this node sees it, as `field:value` lines
//! (the same as INFO's `geo` section): this site, every site, the leader
//! (which ships this site's updates and applies the others'), and per other
//! site how far this site has applied its updates (its stable time, and how
//! many milliseconds behind the wall clock that is), how long its updates
//! took to become visible here (p50 and p99 over the last minute, from
//! their timestamps: `geo::visibility`), and the link to it. A
//! single-site deployment answers `sites:<its id>` and nothing more.
//!
//! CW.WAN changes this node's emulated wide-area link to a site (`peer::
//! wan`): CUT drops everything to and from it until RESTORE; DELAY sets its
//! one-way delay. Replies `+OK`; an unknown site is an error.
//!
//! CW.CLOCK SKEW ms puts this node's wall clock `ms` ahead (negative:
//! behind; 0: right again), the way a machine's clock drifts: the hybrid
//! clocks must keep causality and last-writer-wins sane across sites
//! (`causeway torture --sites`).

use crate::config::NodeConfig;
use crate::redis::cmd::{syntax_error, Outcome};
use crate::redis::conn::Conn;
use crate::runtime::{GeoStatus, Handle, LinkState};
use bytes::Bytes;
use causeway_core::geo::Replication;
use causeway_core::hlc::Timestamp;
use causeway_core::version::SiteId;
use causeway_resp::Frame;

pub async fn run(conn: &mut Conn, _args: Vec<Bytes>) -> Outcome {
    let now = conn.server.clock.now_ms();
    let status = conn.node.status();
    let text: String = fields(conn.node.config(), status.geo.as_ref(), now).into_iter().map(|(k, v)| format!("{k}:{v}\r\n")).collect();
    Frame::Bulk(Bytes::from(text)).into()
}

/// The geo-replication fields of this node (`geo`: as `Status::geo` has
/// it), with lags counted to `now` (wall-clock ms).
pub fn fields(config: &NodeConfig, geo: Option<&GeoStatus>, now: u64) -> Vec<(String, String)> {
    let sites: Vec<String> = config.sites().iter().map(|s| s.to_string()).collect();
    let mut f = vec![("site".to_string(), config.site.to_string()), ("sites".to_string(), sites.join(","))];
    let Some(geo) = geo else { return f };
    f.push(("leader".into(), geo.leader.map_or("none".to_string(), |l| l.to_string())));
    f.push(("replication".into(), format!("{:?}", geo.replication).to_lowercase()));
    if geo.replication == Replication::Sequenced {
        // Numbers this node's sequencer handed out (the leader's counts).
        f.push(("sequenced".into(), geo.sequenced.to_string()));
    }
    f.push(("conflicts".into(), geo.conflicts.to_string()));
    f.push(("remote_backlog".into(), geo.remote_backlog.to_string()));
    f.push(("unreported".into(), geo.unreported.to_string()));
    // Local updates a tail could not report in timestamp order, so never
    // shipped: always 0 unless a bug loses writes for other sites.
    f.push(("out_of_order".into(), geo.out_of_order.to_string()));
    if let Some(dr) = &geo.dr {
        // Disaster recovery (`CW.DR STATUS` has it all).
        f.push(("dr_role".into(), dr.role.to_string()));
        f.push(("dr_unfinished_keys".into(), dr.unfinished.to_string()));
        f.push(("dr_unfinished_bytes".into(), dr.unfinished_bytes.to_string()));
        f.push(("dr_notes_whole".into(), u8::from(dr.whole).to_string()));
        f.push(("dr_lost_keys".into(), dr.lost.map_or("-".to_string(), |n| n.to_string())));
    }
    for site in &geo.sites {
        let state = match site.link {
            LinkState::Cut => "cut",
            LinkState::Down => "down",
            LinkState::Up => "up",
        };
        // How long its updates took to become visible here (p50, p99 over
        // the last minute; absent while none came).
        let visible = site
            .visible
            .map_or(String::new(), |d| format!(",visible_p50_ms={},visible_p99_ms={},visible_count={}", d.p50_ms, d.p99_ms, d.count));
        f.push((
            format!("site{}", site.site),
            format!(
                "applied_ms={},lag_ms={}{visible},link={state},delay_ms={},dropped={}",
                site.applied_ms,
                now.saturating_sub(site.applied_ms),
                site.delay_ms,
                site.dropped
            ),
        ));
    }
    f
}

/// Waits, up to `timeout_ms`, until every site of `sites` has applied this
/// site's updates through `mine` (`seen_by`, see `Handle::geo_view`); else
/// the sites still missing, as text. A single site has nothing to wait for.
async fn wait_for(node: &Handle, timeout_ms: u64, sites: &[SiteId], mine: Timestamp) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(timeout_ms);
    loop {
        let Some((_, seen_by)) = node.geo_view() else { return Ok(()) };
        let missing: Vec<String> = sites.iter().filter(|&&s| seen_by.get(s) < mine).map(|s| s.to_string()).collect();
        if missing.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(missing.join(","));
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// CW.WAIT SITE s timeout_ms | CW.WAIT ALL timeout_ms: replies `+OK` once
/// every write this session made (everything of this site in its causal
/// past) is applied in site `s` (or every other site), or, at the timeout,
/// `-TIMEOUT` with the sites still missing. Redis WAIT counts replicas;
/// this counts sites, and survives a failover (the sites' acknowledgements
/// are replicated with the stabilizer).
pub async fn wait(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let word = |i: usize| args.get(i).map(|a| String::from_utf8_lossy(a).to_ascii_lowercase());
    let (target, timeout) = match (word(1).as_deref(), args.len()) {
        (Some("site"), 4) => (word(2).and_then(|s| s.parse::<SiteId>().ok()), word(3)),
        (Some("all"), 3) => (None, word(2)),
        _ => return syntax_error().into(),
    };
    let Some(timeout_ms) = timeout.and_then(|t| t.parse::<u64>().ok()) else { return syntax_error().into() };
    let own = conn.node.config().site;
    let sites: Vec<SiteId> = match (word(1).as_deref(), target) {
        (Some("site"), Some(s)) if conn.node.remote_sites().contains(&s) => vec![s],
        // This session's writes are in its own site once acknowledged.
        (Some("site"), Some(s)) if s == own => return Frame::ok().into(),
        (Some("site"), _) => return Frame::error("ERR no such site in this node's configuration").into(),
        _ => conn.node.remote_sites(),
    };
    let mine = conn.driver.session().past().get(own);
    match wait_for(&conn.node, timeout_ms, &sites, mine).await {
        Ok(()) => Frame::ok(),
        Err(missing) => Frame::error(format!("TIMEOUT not yet applied in site(s) {missing}")),
    }
    .into()
}

/// CW.CONFLICTS [count]: the latest concurrent writes from different sites
/// that the heads on this node resolved by last-writer-wins (at most 16 per
/// partition, newest first, 10 by default), one line each: key, the
/// version kept, the version thrown away (timestamp@site). The total is
/// `conflicts` in CW.SITES.
pub async fn conflicts(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let count = match args.get(1).map(|a| String::from_utf8_lossy(a).parse::<usize>()) {
        None => 10,
        Some(Ok(n)) if args.len() == 2 => n,
        _ => return syntax_error().into(),
    };
    let lines = conn.node.recent_conflicts(count);
    let frames = lines
        .into_iter()
        .map(|c| Frame::Bulk(Bytes::from(format!("{} kept={} lost={}", String::from_utf8_lossy(&c.key), c.kept, c.lost))))
        .collect();
    Frame::Array(frames).into()
}

pub async fn wan(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let word = |i: usize| args.get(i).map(|a| String::from_utf8_lossy(a).to_ascii_lowercase());
    let Some(site) = word(2).and_then(|s| s.parse::<SiteId>().ok()) else { return syntax_error().into() };
    if site == conn.node.config().site {
        return Frame::error(format!("ERR site {site} is this node's own site: name the other end of the link")).into();
    }
    if !conn.node.remote_sites().contains(&site) {
        return Frame::error(format!("ERR site {site} is not in this node's configuration")).into();
    }
    match (word(1).as_deref(), args.len()) {
        (Some("cut"), 3) => conn.node.set_site_cut(site, true),
        (Some("restore"), 3) => conn.node.set_site_cut(site, false),
        (Some("delay"), 4) => match word(3).and_then(|ms| ms.parse().ok()) {
            Some(ms) => conn.node.set_site_delay_ms(site, ms),
            None => return syntax_error().into(),
        },
        _ => return syntax_error().into(),
    }
    Frame::ok().into()
}

pub async fn clock(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let skew = String::from_utf8_lossy(&args[1]).eq_ignore_ascii_case("skew");
    match std::str::from_utf8(&args[2]).ok().and_then(|ms| ms.parse::<i64>().ok()) {
        Some(ms) if skew => {
            conn.server.clock.set_skew_ms(ms);
            Frame::ok().into()
        }
        _ => syntax_error().into(),
    }
}

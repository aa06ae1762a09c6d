//! CW.SITES, and CW.WAN CUT|RESTORE site | DELAY site ms
//!
//! CW.SITES: geo-replication as this node sees it, as `field:value` lines
//! (the same as INFO's `geo` section): this site, every site, the leader
//! (which ships this site's updates and applies the others'), and per other
//! site how far this site has applied its updates (its stable time, and how
//! many milliseconds behind the wall clock that is), and the link to it. A
//! single-site deployment answers `sites:<its id>` and nothing more.
//!
//! CW.WAN changes this node's emulated wide-area link to a site (`peer::
//! wan`): CUT drops everything to and from it until RESTORE; DELAY sets its
//! one-way delay. Replies `+OK`; an unknown site is an error.

use crate::cmd::{syntax_error, Outcome};
use crate::conn::Conn;
use crate::server::{now_ms, Node};
use bytes::Bytes;
use causeway_core::version::SiteId;
use causeway_resp::Frame;

pub async fn run(conn: &mut Conn, _args: Vec<Bytes>) -> Outcome {
    let text: String = fields(&conn.node).into_iter().map(|(k, v)| format!("{k}:{v}\r\n")).collect();
    Frame::Bulk(Bytes::from(text)).into()
}

/// The geo-replication fields of this node.
pub fn fields(node: &Node) -> Vec<(String, String)> {
    let sites: Vec<String> = node.config.sites().iter().map(|s| s.to_string()).collect();
    let mut f = vec![("site".to_string(), node.config.site.to_string()), ("sites".to_string(), sites.join(","))];
    let topology = node.topology();
    let now = now_ms();
    node.with_core(|core| {
        let Some(geo) = core.geo() else { return };
        let leader = geo.leader_of(&topology).map_or("none".to_string(), |l| l.to_string());
        f.push(("leader".into(), leader));
        f.push(("conflicts".into(), core.conflicts().to_string()));
        f.push(("remote_backlog".into(), geo.backlog().to_string()));
        f.push(("unreported".into(), geo.unreported().to_string()));
        for link in node.site_links() {
            let applied = geo.site_time().get(link.site).physical_ms;
            let state = if link.is_cut() {
                "cut"
            } else if link.is_down() {
                "down"
            } else {
                "up"
            };
            f.push((
                format!("site{}", link.site),
                format!(
                    "applied_ms={applied},lag_ms={},link={state},delay_ms={},dropped={}",
                    now.saturating_sub(applied),
                    link.delay_ms(),
                    link.dropped.load(std::sync::atomic::Ordering::Relaxed)
                ),
            ));
        }
    });
    f
}

pub async fn wan(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let word = |i: usize| args.get(i).map(|a| String::from_utf8_lossy(a).to_ascii_lowercase());
    let Some(site) = word(2).and_then(|s| s.parse::<SiteId>().ok()) else { return syntax_error().into() };
    let Some(link) = conn.node.site_link(site) else {
        return Frame::error(format!("ERR site {site} is not in this node's configuration")).into();
    };
    match (word(1).as_deref(), args.len()) {
        (Some("cut"), 3) => link.set_cut(true),
        (Some("restore"), 3) => link.set_cut(false),
        (Some("delay"), 4) => match word(3).and_then(|ms| ms.parse().ok()) {
            Some(ms) => link.set_delay_ms(ms),
            None => return syntax_error().into(),
        },
        _ => return syntax_error().into(),
    }
    Frame::ok().into()
}

//! The link to another site, through an emulated wide-area network: every
//! message waits the link's one-way delay (plus jitter, keeping order, as a
//! TCP connection over a long path would) before it is handed to the
//! `link::Link` that carries it, and a cut link drops what is sent to the
//! site and what arrives from it until it is restored. The kernel here has
//! no netem; this is the same emulation for `causeway dev --sites`, the
//! tests and the benchmarks. With delay 0 and no cut (a real deployment)
//! messages go straight to the link.

use super::link::Link;
use causeway_core::message::Message;
use causeway_core::ring::NodeId;
use causeway_core::version::SiteId;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::time::{Duration, Instant};

/// This node's link to one other site.
pub struct SiteLink {
    pub site: SiteId,
    link: Link,
    delay_ms: AtomicU64,
    jitter_ms: u64,
    cut: AtomicBool,
    /// Messages waiting out the delay, with when they may leave.
    delayed: mpsc::UnboundedSender<(Instant, Message)>,
    /// The latest departure scheduled (departures keep the send order).
    last: Mutex<Instant>,
    /// Messages dropped because the link was cut (both ways).
    pub dropped: AtomicU64,
}

impl SiteLink {
    /// The link from node `me` of site `from` to site `site`.
    pub fn spawn(from: SiteId, me: NodeId, site: &crate::config::RemoteSite, secret: Option<Arc<str>>, jitter_ms: u64) -> Arc<SiteLink> {
        let link = Link::to_site(from, me, site.addrs.clone(), secret);
        let (site, delay_ms) = (site.id, site.delay_ms);
        let (delayed, mut rx) = mpsc::unbounded_channel::<(Instant, Message)>();
        let carrier = link.clone();
        tokio::spawn(async move {
            while let Some((at, msg)) = rx.recv().await {
                tokio::time::sleep_until(at).await;
                carrier.send(&msg);
            }
        });
        Arc::new(SiteLink {
            site,
            link,
            delay_ms: AtomicU64::new(delay_ms),
            jitter_ms,
            cut: AtomicBool::new(false),
            delayed,
            last: Mutex::new(Instant::now()),
            dropped: AtomicU64::new(0),
        })
    }

    /// Sends `msg` to the site (after the emulated delay), unless cut.
    pub fn send(&self, msg: Message) {
        if self.is_cut() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let delay = self.delay_ms.load(Ordering::Relaxed);
        if delay == 0 && self.jitter_ms == 0 {
            return self.link.send(&msg);
        }
        let jitter = if self.jitter_ms > 0 { rand::random::<u64>() % (self.jitter_ms + 1) } else { 0 };
        let mut last = self.last.lock();
        let at = (Instant::now() + Duration::from_millis(delay + jitter)).max(*last);
        *last = at;
        let _ = self.delayed.send((at, msg));
    }

    /// Whether messages from the site are dropped on arrival (the link is
    /// cut: both ways).
    pub fn takes(&self) -> bool {
        if self.is_cut() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    pub fn is_cut(&self) -> bool {
        self.cut.load(Ordering::Relaxed)
    }

    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::Relaxed);
    }

    pub fn delay_ms(&self) -> u64 {
        self.delay_ms.load(Ordering::Relaxed)
    }

    pub fn set_delay_ms(&self, ms: u64) {
        self.delay_ms.store(ms, Ordering::Relaxed);
    }

    /// What was handed to the link so far (after the delay).
    pub fn sent(&self) -> super::link::Sent {
        self.link.sent()
    }

    /// Whether the connection to the site is down right now.
    pub fn is_down(&self) -> bool {
        self.link.is_down()
    }
}
